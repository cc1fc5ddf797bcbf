// Package fleettorture holds the fleet torture test: two control-plane replica
// processes on a real redis-server (and on a three-node Redis Cluster), three
// sluice-devproxy processes and N in-process Envoys (the real sluice.wasm under
// the testenv host), all spending one hot fleet key (its user id 2 KB long, so the
// key carries it as a digest), while the test kills a proxy
// holding leases, freezes Redis (SIGSTOP) for 5 s, kills Redis and restarts it
// empty, and kills a control-plane replica.
//
// It judges by counting, per window of the rules' fixed window:
//
//   - rule "tight" (limit L per window, on_quota_failure deny): admitted ≤ L in
//     every window, except the window in which Redis lost its data, where the
//     fleet counter restarts from zero (≤ 2L, the documented bound); with demand
//     above L and no fault, admitted = L, less at most 2 % of L (units leased in
//     the window's last moments to an Envoy that sees no further request in it
//     expire unspent), or 5 % while 64 more quota clients saturate the cores on
//     purpose (answers then reach their Envoy after the window ended);
//   - rule "loose" (limit 10^8): no 429 at all in a window without a fault, since
//     its budget can never be spent (a 429 there is a false one).
//
// A request counts in a window when it was sent and answered within it (loopback
// round trips are far shorter than a window); the few that straddle a boundary
// count towards the upper bound of both windows and the lower bound of neither.
// TestMixedFleetKeepsItsLimitThroughOutages adds Envoys of Envoy's own
// rate_limit_quota kind (reporting every 5 s) beside Wasm ones on a rule that
// degrades to local shares, and bounds what the fleet admits per window while one
// Envoy, then Redis, is cut off: L plus the cut-off Envoy's share of L, L while
// Redis is frozen a whole window, 2 L in the windows such an outage begins or ends.
//
// Every process listens on loopback only and is stopped by the test; the package
// has no non-test code.
package fleettorture
