// Package proxywasm is sluice's guest-side binding of the proxy-wasm ABI
// v0.2.1 (spec: github.com/proxy-wasm/spec, abi-versions/v0.2.1/README.md)
// for modules built by the standard Go toolchain as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared
//
// It declares every v0.2.1 host import with //go:wasmimport, exports the
// callbacks every HTTP plugin needs with //go:wasmexport (a module that reads
// bodies or trailers, or is a TCP filter, also imports package
// streamexports for those), and dispatches the
// callbacks to the context interfaces of
// github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types (VMContext,
// PluginContext, HttpContext, TcpContext), so plugin code reads like any
// proxy-wasm Go plugin. The Envoy behaviour it relies on, with its upstream
// sources, is in docs/ENVOY.md.
//
// # Setup
//
// Call SetVMContext from an init function. A c-shared module never runs
// main, and while _initialize runs Envoy allows only proxy_log: any other
// proxy_* hostcall from init traps the VM. Nothing in this package calls a
// host function other than proxy_log before the first callback.
//
// # Failure policy
//
// A panic never crosses an export: every callback recovers, logs the panic
// value through proxy_log at error level, and fails open (ActionContinue,
// or true for the bool-returning callbacks), so the request passes.
// Hostcall failures are returned as errors (see ErrNotFound and its
// siblings); nothing in this package panics on a host error.
//
// # Execution model
//
// Each Envoy worker runs its own VM, and a VM runs one callback at a time.
// There are no goroutines and nothing blocks: work that must wait is driven
// by on_tick, on_http_call_response or on_queue_ready. The package keeps
// its state in plain package variables for that reason.
//
// # Memory
//
// Data coming from the host (headers, bodies, shared data, properties) is
// copied by the host into a buffer it obtains from proxy_on_memory_allocate;
// that buffer belongs to the caller afterwards. Strings returned by this
// package are views of such buffers and are never modified by the package.
//
// By default every such buffer is a fresh heap allocation. A callback that
// reads host data on the request path can open a host-scratch scope with
// BeginHostScratch; it ends at EndHostScratch or when the callback returns:
// in between, the buffers come from one reused slab, so that reading
// headers, properties and shared data allocates nothing once warm, and
// every result obtained in the scope is valid only until the scope ends.
//
// # Imports outside the wasm build
//
// On other platforms the package builds with every hostcall answering
// UNIMPLEMENTED (ErrUnimplemented), so its logic can be unit-tested natively.
// There, NewEmulator installs an in-memory host that drives a VMContext
// through Envoy's callback sequences and counts hostcalls, so that plugin
// packages can be tested, allocations included, without a wasm runtime.
// Native hostcalls copy their results through proxy_on_memory_allocate as
// the wasm build does, so both take the same allocation path.
package proxywasm
