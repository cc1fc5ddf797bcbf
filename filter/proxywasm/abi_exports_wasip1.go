//go:build wasip1

package proxywasm

import "unsafe"

// Callbacks of proxy-wasm ABI v0.2.1 (spec abi-versions/v0.2.1; parameter
// lists as in proxy-wasm-cpp-host include/proxy-wasm/wasm.h). Each is a thin
// shim over a portable function in context.go or http.go, which recovers
// panics and fails open. Booleans travel as i32 0/1. gRPC and
// foreign-function callbacks are not exported: sluice makes no gRPC calls and
// calls no foreign functions, and a host looks these up only when it needs
// them.

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

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(onRequestBody(contextID, bodySize, endOfStream != 0))
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(onRequestTrailers(contextID, numTrailers))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return uint32(onResponseHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(onResponseBody(contextID, bodySize, endOfStream != 0))
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(onResponseTrailers(contextID, numTrailers))
}

//go:wasmexport proxy_on_new_connection
func proxyOnNewConnection(contextID uint32) uint32 {
	return uint32(onNewConnection(contextID))
}

//go:wasmexport proxy_on_downstream_data
func proxyOnDownstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(onDownstreamData(contextID, dataSize, endOfStream != 0))
}

//go:wasmexport proxy_on_upstream_data
func proxyOnUpstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(onUpstreamData(contextID, dataSize, endOfStream != 0))
}

//go:wasmexport proxy_on_downstream_connection_close
func proxyOnDownstreamConnectionClose(contextID, peerType uint32) {
	onDownstreamConnectionClose(contextID, peerType)
}

//go:wasmexport proxy_on_upstream_connection_close
func proxyOnUpstreamConnectionClose(contextID, peerType uint32) {
	onUpstreamConnectionClose(contextID, peerType)
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(rootContextID, token, numHeaders, bodySize, numTrailers uint32) {
	onHttpCallResponse(rootContextID, token, numHeaders, bodySize, numTrailers)
}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) bool { return onDone(contextID) }

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) { onLog(contextID) }

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) { onDelete(contextID) }
