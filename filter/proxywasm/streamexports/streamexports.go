// Package streamexports exports the proxy-wasm ABI v0.2.1 callbacks for HTTP
// bodies and trailers and for TCP streams (spec abi-versions/v0.2.1, "HTTP
// fields", "HTTP body" and "TCP/UDP/QUIC stream"), which package proxywasm
// leaves out of a module.
//
// Import it for its side effect in a module whose HttpContext reads or
// changes bodies or trailers, or whose plugin is a network (TCP) filter:
//
//	import _ "github.com/sluice-proxy/sluice/filter/proxywasm/streamexports"
//
// Without it the module has no proxy_on_request_body, proxy_on_response_body,
// proxy_on_*_trailers, proxy_on_new_connection, proxy_on_*_data or
// proxy_on_*_connection_close, and proxy-wasm-cpp-host (the C++ host in
// Envoy) answers those events Continue without entering the module
// (src/context.cc, ContextBase::onRequestBody and its siblings): a request
// with a body then costs no call into Go per chunk. A module without them
// must not rely on a body callback to resume or end a stream it paused.
//
// The exports only forward to proxywasm's Dispatch functions, which recover
// panics and fail open like every other callback.
package streamexports
