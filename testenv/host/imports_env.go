package host

import (
	"context"
	"strings"

	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func i32s(n int) []api.ValueType {
	out := make([]api.ValueType, n)
	for i := range out {
		out[i] = i32
	}
	return out
}

var statusResult = []api.ValueType{i32}

// exportEnv defines an env.proxy_* import returning proxy_status_t.
func (h *Host) exportEnv(b wazero.HostModuleBuilder, name string, params []api.ValueType, fn func(v *vm, s []uint64) status) {
	key := "env." + name
	trace := h.cfg.Trace
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, s []uint64) {
		v := vmFrom(ctx)
		if v.mem == nil {
			v.mem = mod.Memory() // during _initialize
		}
		v.trapIfRestricted(key)
		st := fn(v, s)
		if trace {
			v.trace = append(v.trace, name+" -> "+st.String())
		}
		s[0] = uint64(st)
	}), params, statusResult).Export(name)
}

// instantiateImports builds the "env" module (proxy-wasm imports for the
// module's ABI version) and Envoy's WASI modules.
func (h *Host) instantiateImports(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	h.exportEnv(b, "proxy_log", i32s(3), hostLog)
	if h.abi == "proxy_abi_version_0_2_1" {
		// CPPHOST registerCallbacks: proxy_get_log_level only for 0.2.1.
		h.exportEnv(b, "proxy_get_log_level", i32s(1), func(v *vm, s []uint64) status {
			if !v.writeU32(uint32(s[0]), uint32(v.h.cfg.LogLevel)) {
				return statusInvalidMemoryAccess
			}
			return statusOK
		})
	}
	h.exportEnv(b, "proxy_get_current_time_nanoseconds", i32s(1), func(v *vm, s []uint64) status {
		// 64 bits (MOSN's host writes only 32, PROXYWASM-ENVOY.md §9.2).
		if !v.mem.WriteUint64Le(uint32(s[0]), uint64(v.h.clock.Now().UnixNano())) {
			return statusInvalidMemoryAccess
		}
		return statusOK
	})
	h.exportEnv(b, "proxy_set_tick_period_milliseconds", i32s(1), hostSetTickPeriod)
	h.exportEnv(b, "proxy_get_buffer_bytes", i32s(5), hostGetBufferBytes)
	h.exportEnv(b, "proxy_set_buffer_bytes", i32s(5), hostSetBufferBytes)
	h.exportEnv(b, "proxy_get_buffer_status", i32s(3), hostGetBufferStatus)
	h.exportEnv(b, "proxy_get_header_map_size", i32s(2), hostGetHeaderMapSize)
	h.exportEnv(b, "proxy_get_header_map_pairs", i32s(3), hostGetHeaderMapPairs)
	h.exportEnv(b, "proxy_set_header_map_pairs", i32s(3), hostSetHeaderMapPairs)
	h.exportEnv(b, "proxy_get_header_map_value", i32s(5), hostGetHeaderMapValue)
	h.exportEnv(b, "proxy_add_header_map_value", i32s(5), func(v *vm, s []uint64) status { return hostModifyHeader(v, s, "add") })
	h.exportEnv(b, "proxy_replace_header_map_value", i32s(5), func(v *vm, s []uint64) status { return hostModifyHeader(v, s, "replace") })
	h.exportEnv(b, "proxy_remove_header_map_value", i32s(3), func(v *vm, s []uint64) status { return hostModifyHeader(v, s, "remove") })
	h.exportEnv(b, "proxy_continue_stream", i32s(1), hostContinueStream)
	h.exportEnv(b, "proxy_close_stream", i32s(1), hostCloseStream)
	h.exportEnv(b, "proxy_get_status", i32s(3), func(v *vm, s []uint64) status {
		if !v.writeU32(uint32(s[0]), v.status.code) {
			return statusInvalidMemoryAccess
		}
		return v.copyOut([]byte(v.status.msg), uint32(s[1]), uint32(s[2]))
	})
	h.exportEnv(b, "proxy_send_local_response", i32s(8), hostSendLocalResponse)
	h.exportEnv(b, "proxy_http_call", i32s(10), hostHTTPCall)
	// No gRPC clusters exist in this host: Envoy answers BAD_ARGUMENT for
	// an unknown cluster and NOT_FOUND for an unknown token (ENVOY-CTX
	// grpcCall, grpcSend/Cancel/Close).
	h.exportEnv(b, "proxy_grpc_call", i32s(12), func(*vm, []uint64) status { return statusBadArgument })
	h.exportEnv(b, "proxy_grpc_stream", i32s(9), func(*vm, []uint64) status { return statusBadArgument })
	h.exportEnv(b, "proxy_grpc_send", i32s(4), func(*vm, []uint64) status { return statusNotFound })
	h.exportEnv(b, "proxy_grpc_cancel", i32s(1), func(*vm, []uint64) status { return statusNotFound })
	h.exportEnv(b, "proxy_grpc_close", i32s(1), func(*vm, []uint64) status { return statusNotFound })
	h.exportEnv(b, "proxy_set_shared_data", i32s(5), hostSetSharedData)
	h.exportEnv(b, "proxy_get_shared_data", i32s(5), hostGetSharedData)
	h.exportEnv(b, "proxy_register_shared_queue", i32s(3), hostRegisterQueue)
	h.exportEnv(b, "proxy_resolve_shared_queue", i32s(5), hostResolveQueue)
	h.exportEnv(b, "proxy_enqueue_shared_queue", i32s(3), hostEnqueue)
	h.exportEnv(b, "proxy_dequeue_shared_queue", i32s(3), hostDequeue)
	h.exportEnv(b, "proxy_define_metric", i32s(4), hostDefineMetric)
	h.exportEnv(b, "proxy_increment_metric", []api.ValueType{i32, i64}, hostIncrementMetric)
	h.exportEnv(b, "proxy_record_metric", []api.ValueType{i32, i64}, hostRecordMetric)
	h.exportEnv(b, "proxy_get_metric", i32s(2), hostGetMetric)
	h.exportEnv(b, "proxy_get_property", i32s(4), hostGetProperty)
	h.exportEnv(b, "proxy_set_property", i32s(4), hostSetProperty)
	h.exportEnv(b, "proxy_set_effective_context", i32s(1), func(v *vm, s []uint64) status {
		// CPPHOST exports.cc set_effective_context: unknown id → BAD_ARGUMENT.
		id := uint32(s[0])
		if id != v.rootID && v.streams[id] == nil {
			return statusBadArgument
		}
		v.effective = id
		return statusOK
	})
	h.exportEnv(b, "proxy_done", nil, func(v *vm, _ []uint64) status {
		// CPPHOST WasmBase::done: NOT_FOUND unless the root context is
		// pending after on_done returned false; on_delete is deferred.
		if !v.pendingDone {
			return statusNotFound
		}
		v.pendingDone = false
		v.afterCall = append(v.afterCall, func() { _, _ = v.callback("proxy_on_delete", uint64(v.rootID)) })
		return statusOK
	})
	// Envoy's foreign functions (compress, declare_property, …) are not
	// emulated: unknown names are NOT_FOUND (ENVOY-CTX).
	h.exportEnv(b, "proxy_call_foreign_function", i32s(6), func(*vm, []uint64) status { return statusNotFound })
	if _, err := b.Instantiate(ctx); err != nil {
		return err
	}
	for _, name := range []string{"wasi_snapshot_preview1", "wasi_unstable"} {
		if err := h.instantiateWASI(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

func hostLog(v *vm, s []uint64) status {
	msg, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	lvl := LogLevel(int32(s[0]))
	if lvl < v.h.cfg.LogLevel {
		return statusOK
	}
	v.log(lvl, msg, "proxy_log")
	return statusOK
}

func (v *vm) log(lvl LogLevel, msg, source string) {
	e := LogEntry{Worker: v.index, ContextID: v.effective, Level: lvl, Message: msg}
	if st := v.streams[v.effective]; st != nil {
		st.logs = append(st.logs, e)
	}
	v.h.addLog(e, source)
}

// effectiveStream is the stream of the effective context, or nil on a
// root context.
func (v *vm) effectiveStream() *stream { return v.streams[v.effective] }

// --- buffers ---

func (v *vm) buffer(t uint32) ([]byte, bool) {
	switch t {
	case bufRequestBody, bufResponseBody:
		st := v.effectiveStream()
		if st == nil {
			return nil, false
		}
		if t == bufRequestBody {
			return st.reqBody, st.hasReqBody
		}
		return st.respBody, st.hasRespBody
	case bufCallResponseBody:
		if v.callout == nil {
			return nil, false
		}
		return v.callout.body, true
	case bufVMConfig:
		return v.h.cfg.VMConfig, v.readVMConfig
	case bufPluginConfig:
		return v.h.cfg.PluginConfig, v.readPlugin
	}
	return nil, false
}

func hostGetBufferBytes(v *vm, s []uint64) status {
	data, ok := v.buffer(uint32(s[0]))
	if !ok {
		return statusNotFound
	}
	start, max := uint64(uint32(s[1])), uint64(uint32(s[2]))
	// CPPHOST exports.cc get_buffer_bytes: overflow is BAD_ARGUMENT; the
	// range is clamped to the buffer.
	if start > uint64(len(data)) {
		start = uint64(len(data))
	}
	end := start + max
	if end > uint64(len(data)) {
		end = uint64(len(data))
	}
	return v.copyOut(append([]byte(nil), data[start:end]...), uint32(s[3]), uint32(s[4]))
}

func hostGetBufferStatus(v *vm, s []uint64) status {
	data, ok := v.buffer(uint32(s[0]))
	if !ok {
		return statusNotFound
	}
	// CPPHOST get_buffer_status writes flags 0.
	if !v.writeU32(uint32(s[1]), uint32(len(data))) || !v.writeU32(uint32(s[2]), 0) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostSetBufferBytes(v *vm, s []uint64) status {
	t := uint32(s[0])
	st := v.effectiveStream()
	if st == nil || (t != bufRequestBody && t != bufResponseBody) {
		return statusNotFound
	}
	val, ok := v.read(uint32(s[3]), uint32(s[4]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	buf := &st.reqBody
	if t == bufResponseBody {
		buf = &st.respBody
	}
	start, length := int(uint32(s[1])), int(uint32(s[2]))
	// Envoy BufferWrapper::copyFrom (ENVOY-CTX): start 0 drains `length`
	// bytes and prepends; start ≥ size appends; anything else is
	// BAD_ARGUMENT.
	switch {
	case start == 0:
		if length > len(*buf) {
			length = len(*buf)
		}
		*buf = append(append([]byte(nil), val...), (*buf)[length:]...)
	case start >= len(*buf):
		*buf = append(*buf, val...)
	default:
		return statusBadArgument
	}
	return statusOK
}

// --- header maps ---

// headerMap returns the map the guest addresses, or nil if it is not
// available now (Envoy then answers BAD_ARGUMENT, ENVOY-CTX getMap).
func (v *vm) headerMap(t uint32) *Headers {
	switch t {
	case mapRequestHeaders, mapRequestTrailers, mapResponseHeaders, mapResponseTrailers:
		st := v.effectiveStream()
		if st == nil {
			return nil
		}
		switch t {
		case mapRequestHeaders:
			if st.hasReqHeaders {
				return &st.reqHeaders
			}
		case mapRequestTrailers:
			if st.hasReqTrailers {
				return &st.reqTrailers
			}
		case mapResponseHeaders:
			if st.hasRespHeaders {
				return &st.respHeaders
			}
		case mapResponseTrailers:
			if st.hasRespTrailers {
				return &st.respTrailers
			}
		}
	case mapCallResponseHeaders:
		if v.callout != nil {
			return &v.callout.headers
		}
	case mapCallResponseTrailers:
		if v.callout != nil {
			return &v.callout.trailers
		}
	}
	return nil
}

func hostGetHeaderMapSize(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	if !v.writeU32(uint32(s[1]), uint32(m.byteSize())) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostGetHeaderMapPairs(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	if len(*m) == 0 {
		// CPPHOST get_header_map_pairs: an empty map is ptr 0, size 0.
		return v.copyOut(nil, uint32(s[1]), uint32(s[2]))
	}
	return v.copyOut(pairs.Encode(*m), uint32(s[1]), uint32(s[2]))
}

// writableHeaderMap is the header map t for a set, add, replace or remove,
// or nil (BAD_ARGUMENT) if t is unknown or an HTTP-call response map,
// which the guest may only read.
func (v *vm) writableHeaderMap(t uint32) *Headers {
	if t == mapCallResponseHeaders || t == mapCallResponseTrailers {
		return nil
	}
	return v.headerMap(t)
}

func hostSetHeaderMapPairs(v *vm, s []uint64) status {
	m := v.writableHeaderMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	raw, ok := v.read(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	ps, err := pairs.Decode(raw)
	if err != nil {
		// CPPHOST PairsUtil::toPairs: bad input is treated as an empty map.
		ps = nil
	}
	// ENVOY-CTX setHeaderMapPairs: remove every header, then add each.
	var out Headers
	for _, kv := range ps {
		out = out.add(strings.ToLower(kv[0]), kv[1])
	}
	*m = out
	return statusOK
}

func hostGetHeaderMapValue(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	key, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	key = strings.ToLower(key)
	// ENVOY-CTX getHeaderMapValue: the first value only; absent is
	// NOT_FOUND under ABI 0.2.x.
	for _, kv := range *m {
		if kv[0] == key {
			return v.copyOut([]byte(kv[1]), uint32(s[3]), uint32(s[4]))
		}
	}
	return statusNotFound
}

func hostModifyHeader(v *vm, s []uint64, op string) status {
	m := v.writableHeaderMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	key, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	key = strings.ToLower(key) // Envoy lower-cases keys on every set/add.
	var val string
	if op != "remove" {
		if val, ok = v.readString(uint32(s[3]), uint32(s[4])); !ok {
			return statusInvalidMemoryAccess
		}
	}
	switch op {
	case "add":
		*m = m.add(key, val)
	case "replace":
		// HeaderMap::setCopy: drop every entry of key, then add one.
		*m = m.remove(key).add(key, val)
	case "remove":
		*m = m.remove(key)
	}
	return statusOK
}

// --- stream control ---

func hostContinueStream(v *vm, s []uint64) status {
	switch uint32(s[0]) {
	case 0, 1:
	case 2, 3:
		return statusUnimplemented // ENVOY-CTX continueStream: not for HTTP.
	default:
		return statusBadArgument
	}
	st := v.effectiveStream()
	if st == nil {
		return statusNotFound
	}
	response := uint32(s[0]) == 1
	// Deferred until the VM call returns (ENVOY-CTX continueStream posts
	// continueDecoding/continueEncoding as an after-VM-call action).
	v.afterCall = append(v.afterCall, func() { st.resume(response) })
	return statusOK
}

func hostCloseStream(v *vm, s []uint64) status {
	switch uint32(s[0]) {
	case 0, 1:
	case 2, 3:
		return statusUnimplemented
	default:
		return statusBadArgument
	}
	st := v.effectiveStream()
	if st == nil {
		return statusNotFound
	}
	// ENVOY-CTX closeStream: resetStream with details wasm_close_stream.
	v.afterCall = append(v.afterCall, func() { st.reset("wasm_close_stream") })
	return statusOK
}

func hostSendLocalResponse(v *vm, s []uint64) status {
	details, ok1 := v.readString(uint32(s[1]), uint32(s[2]))
	body, ok2 := v.read(uint32(s[3]), uint32(s[4]))
	hraw, ok3 := v.read(uint32(s[5]), uint32(s[6]))
	if !ok1 || !ok2 || !ok3 {
		return statusInvalidMemoryAccess
	}
	body = append([]byte(nil), body...)
	ps, err := pairs.Decode(hraw)
	if err != nil {
		ps = nil
	}
	st := v.effectiveStream()
	if st == nil {
		// ENVOY-CTX sendLocalResponse: no decoder callbacks on a root
		// context, so a silent no-op that still returns OK.
		return statusOK
	}
	lr := &LocalReply{Status: int(uint32(s[0])), Body: body, Details: strings.Join(strings.Fields(details), "_")}
	for _, kv := range ps {
		// addCopy appends, keys lower-cased.
		lr.Headers = lr.Headers.add(strings.ToLower(kv[0]), kv[1])
	}
	if g := int32(uint32(s[7])); g >= 0 && g <= 16 {
		lr.GRPCStatus = &g
	}
	// CPPHOST send_local_response: stopNextIteration(true); the reply
	// itself is sent after the VM call (ENVOY-CTX).
	v.forceStop = true
	v.afterCall = append(v.afterCall, func() { st.sendLocalReply(lr) })
	return statusOK
}

// --- shared data ---

func hostSetSharedData(v *vm, s []uint64) status {
	key, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	val, ok2 := v.read(uint32(s[2]), uint32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	if hook := v.h.cfg.SharedDataHook; hook != nil {
		hook(v.index, v.callName, "set", key)
	}
	_, st := v.h.store.set(v.h.cfg.VMID, key, val, uint32(s[4]))
	return st
}

func hostGetSharedData(v *vm, s []uint64) status {
	key, ok := v.readString(uint32(s[0]), uint32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	if hook := v.h.cfg.SharedDataHook; hook != nil {
		hook(v.index, v.callName, "get", key)
	}
	val, cas, found := v.h.store.get(v.h.cfg.VMID, key)
	if !found {
		return statusNotFound
	}
	if st := v.copyOut(val, uint32(s[2]), uint32(s[3])); st != statusOK {
		return st
	}
	if !v.writeU32(uint32(s[4]), cas) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

// --- properties ---

func hostGetProperty(v *vm, s []uint64) status {
	path, ok := v.readString(uint32(s[0]), uint32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	val, st := v.property(strings.Split(path, "\x00"))
	if st != statusOK {
		return st
	}
	return v.copyOut(val, uint32(s[2]), uint32(s[3]))
}

func hostSetProperty(v *vm, s []uint64) status {
	path, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	val, ok2 := v.read(uint32(s[2]), uint32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	st := v.effectiveStream()
	if st == nil {
		// ENVOY-CTX setProperty needs the stream info: NOT_FOUND on a root
		// context.
		return statusNotFound
	}
	// Filter state "wasm." + raw path bytes (NULs included), a Bytes
	// CelState (PROXYWASM-ENVOY.md §3.1).
	st.filterState["wasm."+path] = append([]byte(nil), val...)
	return statusOK
}

// --- metrics ---

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

// --- ticks ---

func hostSetTickPeriod(v *vm, s []uint64) status {
	// CPPHOST ContextBase::setTimerPeriod keys the timer by the root
	// context; Envoy arms one timer per root context on the VM's
	// dispatcher, first fire after one period (ENVOY-WASM setTimerPeriod).
	v.setTick(uint32(s[0]))
	return statusOK
}
