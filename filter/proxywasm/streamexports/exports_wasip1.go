//go:build wasip1

package streamexports

import "github.com/sluice-proxy/sluice/filter/proxywasm"

// Booleans travel as i32 0/1; parameter lists as in proxy-wasm-cpp-host
// include/proxy-wasm/wasm.h.

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(proxywasm.DispatchRequestBody(contextID, bodySize, endOfStream != 0))
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(proxywasm.DispatchRequestTrailers(contextID, numTrailers))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(proxywasm.DispatchResponseBody(contextID, bodySize, endOfStream != 0))
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(proxywasm.DispatchResponseTrailers(contextID, numTrailers))
}

//go:wasmexport proxy_on_new_connection
func proxyOnNewConnection(contextID uint32) uint32 {
	return uint32(proxywasm.DispatchNewConnection(contextID))
}

//go:wasmexport proxy_on_downstream_data
func proxyOnDownstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(proxywasm.DispatchDownstreamData(contextID, dataSize, endOfStream != 0))
}

//go:wasmexport proxy_on_upstream_data
func proxyOnUpstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(proxywasm.DispatchUpstreamData(contextID, dataSize, endOfStream != 0))
}

//go:wasmexport proxy_on_downstream_connection_close
func proxyOnDownstreamConnectionClose(contextID, peerType uint32) {
	proxywasm.DispatchDownstreamConnectionClose(contextID, peerType)
}

//go:wasmexport proxy_on_upstream_connection_close
func proxyOnUpstreamConnectionClose(contextID, peerType uint32) {
	proxywasm.DispatchUpstreamConnectionClose(contextID, peerType)
}
