// Package rulesync holds the end-to-end tests of rule sync
// (docs/ARCHITECTURE.md, Rule sync inside Envoy): the real build/sluice.wasm
// under the testenv host with four workers, pulling its policy from a real
// control plane (the sluice-controlplane binary, run as a process) backed by
// a real redis-server, or from a test server that serves invalid and
// truncated policies. The package has no non-test code.
//
// Run:
//
//	go test ./testenv/suites/rulesync/
//
// The tests need redis-server on PATH (Debian package redis-server) and
// fail with that message otherwise (testenv/testkit/redisproc). The propagation and load figures are
// measured with
//
//	SLUICE_MEASURE=1 go test -run Measure -v -timeout 20m ./testenv/suites/rulesync/
package rulesync
