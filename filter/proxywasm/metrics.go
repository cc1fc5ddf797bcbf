package proxywasm

// Metrics (spec v0.2.1 "Metrics"; Envoy semantics in docs/ENVOY.md, Metrics).
// Envoy names the stat "wasmcustom.<name>" and shares it between worker VMs,
// so values aggregate across workers. Define metrics in OnPluginStart, not in
// init (Envoy allows only proxy_log there).

// MetricCounter is a counter defined with DefineCounterMetric.
type MetricCounter uint32

// MetricGauge is a gauge defined with DefineGaugeMetric.
type MetricGauge uint32

// MetricHistogram is a histogram defined with DefineHistogramMetric.
type MetricHistogram uint32

func defineMetric(mt MetricType, name string) (uint32, error) {
	id, st := hostDefineMetric(mt, name)
	if err := statusError(st); err != nil {
		return 0, err
	}
	return id, nil
}

// DefineCounterMetric creates or finds the counter name with
// proxy_define_metric(COUNTER).
func DefineCounterMetric(name string) (MetricCounter, error) {
	id, err := defineMetric(MetricTypeCounter, name)
	return MetricCounter(id), err
}

// DefineGaugeMetric creates or finds the gauge name with
// proxy_define_metric(GAUGE).
func DefineGaugeMetric(name string) (MetricGauge, error) {
	id, err := defineMetric(MetricTypeGauge, name)
	return MetricGauge(id), err
}

// DefineHistogramMetric creates or finds the histogram name with
// proxy_define_metric(HISTOGRAM).
func DefineHistogramMetric(name string) (MetricHistogram, error) {
	id, err := defineMetric(MetricTypeHistogram, name)
	return MetricHistogram(id), err
}

// ID returns the host's metric id.
func (m MetricCounter) ID() uint32 { return uint32(m) }

// Increment adds delta to the counter with proxy_increment_metric. Envoy
// rejects a delta of 0 with BAD_ARGUMENT, so Increment(0) returns nil
// without a hostcall. Errors: ErrBadArgument if delta exceeds MaxInt64;
// ErrNotFound for an undefined counter.
func (m MetricCounter) Increment(delta uint64) error {
	if delta == 0 {
		return nil
	}
	if delta > 1<<63-1 {
		return ErrBadArgument
	}
	return statusError(hostIncrementMetric(uint32(m), int64(delta)))
}

// Value returns the counter's current value with proxy_get_metric.
func (m MetricCounter) Value() (uint64, error) { return getMetric(uint32(m)) }

// ID returns the host's metric id.
func (m MetricGauge) ID() uint32 { return uint32(m) }

// Increment adds delta, which may be negative, to the gauge with
// proxy_increment_metric.
func (m MetricGauge) Increment(delta int64) error {
	return statusError(hostIncrementMetric(uint32(m), delta))
}

// Record sets the gauge to value with proxy_record_metric.
func (m MetricGauge) Record(value uint64) error {
	return statusError(hostRecordMetric(uint32(m), value))
}

// Value returns the gauge's current value with proxy_get_metric.
func (m MetricGauge) Value() (uint64, error) { return getMetric(uint32(m)) }

// ID returns the host's metric id.
func (m MetricHistogram) ID() uint32 { return uint32(m) }

// Record records one sample with proxy_record_metric. Envoy histograms
// cannot be read back (proxy_get_metric answers BAD_ARGUMENT), so there is
// no Value.
func (m MetricHistogram) Record(value uint64) error {
	return statusError(hostRecordMetric(uint32(m), value))
}

func getMetric(id uint32) (uint64, error) {
	v, st := hostGetMetric(id)
	if err := statusError(st); err != nil {
		return 0, err
	}
	return v, nil
}
