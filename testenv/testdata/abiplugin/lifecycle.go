package main

// filter/proxywasm exports neither proxy_on_log nor proxy_on_done (a
// context's end runs from proxy_on_delete). This plugin exports both, as
// no-ops, so that the host's tests see the whole lifecycle Envoy sends a
// module that has them: on_log, on_done, on_delete for a stream, and
// on_done before on_delete for a root.

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) {}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) bool { return true }
