// Package devproxy is sluice's dev proxy: an HTTP server that runs every
// request through the real build/sluice.wasm on the testenv host (package
// host, N worker VMs over one shared-data store, real time) and forwards it
// to an upstream, configured from an Envoy bootstrap (envoy/envoy.yaml),
// and writes the JSON access-log line Envoy would write, from the same
// filter state. What runs locally is what Envoy loads.
//
// # What it takes from the Envoy file
//
// ParseEnvoyConfig decodes the bootstrap into go-control-plane's
// Bootstrap type (protojson, unknown fields rejected, typed configs
// resolved) and runs its validation, then takes: the first listener's
// address; its HTTP connection manager's use_remote_address,
// xff_num_trusted_hops, skip_xff_append, preserve_external_request_id and
// generate_request_id (original_ip_detection_extensions are refused); the first route's
// cluster; the envoy.filters.http.wasm filter (name, root_id, vm_id,
// configuration, vm_config.configuration, environment variables, the
// code's filename, failure_policy); STATIC and STRICT_DNS clusters' first
// endpoint (the route's upstream, and the clusters the filter calls with
// proxy_http_call); and the file access log's path and json_format. Every
// other field that is set is listed in EnvoyConfig.Ignored, which the
// binary prints at start.
//
// # Behaviour (Envoy is the reference)
//
//   - Request headers reach the filter as Envoy's HCM builds them: pseudo
//     headers first, lower-case, hop-by-hop headers removed, x-request-id
//     kept or generated (a version-4 UUID).
//   - The client address is the HCM's trusted client address
//     (use_remote_address, xff_num_trusted_hops; Envoy's headers doc,
//     "x-forwarded-for"): the filter's source.address and the access log's
//     %DOWNSTREAM_REMOTE_ADDRESS%. x-forwarded-for values are joined with
//     "," and, with use_remote_address and without skip_xff_append, the
//     TCP peer is appended (Envoy's own local address for a loopback peer).
//   - A local reply from the filter is sent as is (content-type text/plain
//     added when it has a body and no content-type); a stream the filter
//     closes is a closed connection.
//   - Upstream failures become the router's own replies, which pass the
//     filter's response phase like any response: 503 "upstream connect
//     error or disconnect/reset before headers. reset reason: connection
//     failure" (flag UF) or "... connection termination" (UC), 504
//     "upstream request timeout" (UT, route timeout 15s).
//   - A client that goes away before the response is a downstream reset:
//     the stream ends (on_log, on_done, on_delete: a concurrency slot is
//     released), the log line has response code 0 and flag DC.
//   - A failed VM is bypassed with failure_policy FAIL_OPEN, else answered
//     with 503 (details wasm_fail_stream); the request whose callback
//     trapped gets that 503 under either policy, as in Envoy.
//   - The access log renders log_format.json_format typed (Format).
//
// # Deviations
//
// HTTP/1.1 only, no TLS; bodies are buffered whole (at most
// Options.MaxBodyBytes) and handed to the filter in one chunk, with no
// trailers; one upstream address per cluster, no retries, no health
// checks; x-envoy-upstream-service-time is measured around the whole
// upstream exchange; and the host's own deviations (package host).
package devproxy
