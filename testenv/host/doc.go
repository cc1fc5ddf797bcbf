// Package host runs a proxy-wasm (ABI v0.2.1) module on wazero the way
// Envoy runs a Wasm HTTP filter, for tests and local development.
//
// It implements the env.proxy_* imports and Envoy's WASI surface with
// Envoy's semantics, citing the source each non-obvious behaviour follows
// (docs/ENVOY.md collects them; CPPHOST = proxy-wasm-cpp-host, ENVOY-CTX =
// envoy source/extensions/common/wasm/context.cc):
//
//   - a reactor started with _initialize (then main or __main_void), where
//     only proxy_log and Envoy's start-time WASI calls are allowed, and a
//     guest allocator (malloc, else proxy_on_memory_allocate) inside which
//     only proxy_log, fd_write, clock_time_get (and poll_oneoff since PR
//     #533) are; any other hostcall traps (restricted_callback);
//   - a canary VM that runs on_vm_start/on_configure and is discarded,
//     then N worker VMs, each with root context 1 and its own event loop;
//   - streams: on_context_create lazily before the first headers, request
//     and response phases, then on_log, on_done, on_delete (Envoy's
//     order, not the spec's); PAUSE from headers stops until
//     proxy_continue_stream or a local reply;
//   - header maps with pseudo-headers first and lower-case keys;
//     properties (request.*, response.*, source.*, plugin_*, …) and
//     filter state "wasm."+path read back as an access log would;
//   - shared data (one map per vm_id, global cas counter, no deletion) and
//     shared queues across all VMs of a Host; metrics aggregated by name;
//   - HTTP callouts to named clusters over real HTTP, answered on the
//     VM's loop through proxy_on_http_call_response on the root context;
//   - ticks, WASI wall time and proxy_get_current_time_nanoseconds from a
//     Clock that tests advance (VirtualClock); the WASI monotonic clock
//     stays real so the Go GC paces normally.
//
// Compiled modules are cached process-wide, so many Hosts of one module
// compile it once.
//
// # Usage
//
// Example (example_test.go) starts the real filter in two worker VMs on a
// VirtualClock with host.New, sends requests with Worker.Do, reads the
// Response (Status, Headers, LocalReply, FilterState keyed as Envoy's
// filter state, e.g. "wasm.sluice") and moves time with
// VirtualClock.Advance, which fires due ticks on every worker. Its output
// is checked by go test, so it stays in step with the API. A filter that
// calls out (proxy_http_call) also needs Config.Clusters, which maps Envoy
// cluster names to "host:port" addresses.
//
// A run that must repeat exactly (the policy lab, controlplane/internal/lab)
// also sets Config.Rand (a seeded source for WASI random_get) and
// Config.InlineCallouts with an HTTPClient that answers in process: every
// call is then answered right after the callback that made it, and
// Host.WaitCallouts returns once all are delivered. VirtualClock.Skip jumps
// over an idle stretch firing each due timer once, as after a stopped
// process; UseCompilationCacheDir keeps compiled modules on disk across
// processes.
//
// For a proxy, drive a Stream phase by phase: Worker.NewStream,
// RequestHeaders/Body/Trailers (Wait when Paused), ResponseHeaders/…,
// Finish (ExampleWorker_NewStream).
//
// # Known deviations from Envoy
//
// Local replies do not run the filter's own response callbacks; request
// body sent while the request is paused at its headers is refused
// (ErrStreamState) instead of buffered; gRPC calls and foreign functions
// are not emulated; a VM that traps stays failed (no FAIL_RELOAD);
// WASI calls outside Envoy's list fall back to wazero's (with no
// filesystem) and are not phase-checked.
package host
