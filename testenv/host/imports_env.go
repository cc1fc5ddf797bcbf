package host

import (
	"context"

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
	calls := h.calls.counter(name)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, s []uint64) {
		calls.Add(1)
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
	h.calls = importCounters{}
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
		// 64 bits (mosn/proxy-wasm-go-host writes only 32).
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
