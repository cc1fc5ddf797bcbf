//go:build wasip1

package proxywasm

import "unsafe"

// Callbacks of proxy-wasm ABI v0.2.1 (spec abi-versions/v0.2.1; parameter
// lists as in proxy-wasm-cpp-host include/proxy-wasm/wasm.h). Each is a thin
// shim over a portable function in context.go or http.go, which recovers
// panics and fails open. Booleans travel as i32 0/1.
//
// Only what every HTTP plugin needs is exported here. The body, trailer and
// TCP callbacks are exported by package streamexports, which a module
// imports for its side effect when it reads bodies or is a network filter:
// proxy-wasm-cpp-host answers a callback the module does not export with
// Continue without entering it (context.cc, the onRequestBody family), so a
// module without them costs nothing per body chunk, trailer or data frame.
// gRPC and foreign-function callbacks are not exported at all: sluice makes
// no gRPC calls and calls no foreign functions.
//
// Nor are proxy_on_log and proxy_on_done: every stream ends with
// proxy_on_delete, which runs the stream-done callback, and every root
// context that shuts down gets proxy_on_delete as well, which runs
// OnPluginDone. proxy-wasm-cpp-host skips on_log when it is not exported and
// answers a missing on_done with true, so deletion follows at once
// (src/context.cc ContextBase::onLog, onDone, onDelete; WasmBase::startShutdown).
// Each callback Envoy enters costs a Go entry per stream; two fewer of them
// is a measured part of a request's cost (docs/benchmarks.md).

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion021() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer { return allocate(size) }

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentContextID uint32) {
	onContextCreate(contextID, parentContextID)
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootContextID, vmConfigurationSize uint32) bool {
	return onVMStart(rootContextID, vmConfigurationSize)
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootContextID, pluginConfigurationSize uint32) bool {
	return onConfigure(rootContextID, pluginConfigurationSize)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootContextID uint32) { onTick(rootContextID) }

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(rootContextID, queueID uint32) { onQueueReady(rootContextID, queueID) }

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return uint32(onRequestHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return uint32(onResponseHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(rootContextID, token, numHeaders, bodySize, numTrailers uint32) {
	onHttpCallResponse(rootContextID, token, numHeaders, bodySize, numTrailers)
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) { onDelete(contextID) }
