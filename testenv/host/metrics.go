package host

// Metrics: proxy_define_metric, proxy_increment_metric, proxy_record_metric and
// proxy_get_metric (spec v0.2.1 "Metrics").

func hostDefineMetric(v *vm, s []uint64) status {
	t := uint32(s[0])
	if t > uint32(MetricHistogram) {
		return statusBadArgument
	}
	name, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	m := v.h.metrics.define(MetricType(t), name)
	// CPPHOST wasm.h nextCounterMetricId etc.: += 4, type in the low 2 bits.
	v.nextMetricID[t] += 4
	id := v.nextMetricID[t]
	v.metricIDs[id] = m
	if !v.writeU32(uint32(s[3]), id) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostIncrementMetric(v *vm, s []uint64) status {
	m := v.metricIDs[uint32(s[0])]
	if m == nil {
		return statusNotFound
	}
	return v.h.metrics.increment(m, int64(s[1]))
}

func hostRecordMetric(v *vm, s []uint64) status {
	m := v.metricIDs[uint32(s[0])]
	if m == nil {
		return statusNotFound
	}
	return v.h.metrics.record(m, s[1])
}

func hostGetMetric(v *vm, s []uint64) status {
	m := v.metricIDs[uint32(s[0])]
	if m == nil {
		return statusNotFound
	}
	val, st := v.h.metrics.get(m)
	if st != statusOK {
		return st
	}
	if !v.mem.WriteUint64Le(uint32(s[1]), val) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}
