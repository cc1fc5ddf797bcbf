// Package testenv is Envoy on a laptop, in two halves told apart by their paths.
//
// The harness ships, and people run it: host (a proxy-wasm host on wazero with
// Envoy's semantics), devproxy (an HTTP proxy running every request through the
// real module on that host, configured from envoy/envoy.yaml), filterstate (the
// decision the filter writes per request), and their commands under cmd/
// (sluice-devproxy; sluice-run and sluice-echo behind make run; reqcost, which
// prices one request). The policy lab (sluicectl test and replay) runs on host.
//
// The suites do not ship: suites/ holds every end-to-end suite (test code only:
// the real binaries, the real module, the real Envoy, real Redis, all on
// loopback), and testkit/ the helpers they and the control plane's tests share
// (child processes, the real Envoy, Redis, certificates, an RLQS client that
// behaves as Envoy's).
package testenv
