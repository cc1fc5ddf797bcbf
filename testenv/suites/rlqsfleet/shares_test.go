package rlqsfleet

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// TestWasmAndRLQSEnvoysShareByDemand: three Envoys of the rate_limit_quota kind
// (reporting every 5 s) and two Wasm Envoys (asking whenever their lease runs
// dry), all offered far more than the limit, on two control planes with no fault.
// In every full window the RLQS side admits its demand's share, 3/5 of what was
// admitted, within ±20 %, and no RLQS Envoy is left with nothing: the Wasm
// filters, asking each time their lease runs dry, must not drain the RLQS shares
// one unit a call before those Envoys report.
func TestWasmAndRLQSEnvoysShareByDemand(t *testing.T) {
	redis := redisproc.Start(t)
	a, b := startControlPlane(t, redis.URL()), startControlPlane(t, redis.URL())
	v := proctest.PutPolicy(t, a.addr, policyName, adminToken, hotPolicy)
	f := startMixedFleet(t, a, b, v)
	start := time.Now()
	// The first window after start is a warm-up (streams open, first
	// assignments); three full windows follow.
	first := (start.UnixNano()/int64(window) + 2) * int64(window)
	time.Sleep(time.Until(time.Unix(0, first+3*int64(window)))) // the run's length, traffic meanwhile
	f.stop()

	starts, counts := f.adm.perWindow(first-1, first+3*int64(window))
	if len(starts) != 3 {
		t.Fatalf("%d whole windows, want 3", len(starts))
	}
	for i, c := range counts {
		total := sum(c)
		side := c["rlqs-a1"] + c["rlqs-a2"] + c["rlqs-b"]
		t.Logf("window %s: %d admitted (limit %d), RLQS side %d: %v", time.Unix(0, starts[i]).Format("15:04:05"), total, limit, side, sortedCounts(c))
		if total > limit {
			t.Errorf("window %d admitted %d > %d", i, total, limit)
		}
		if lo, hi := total*3/5*8/10, total*3/5*12/10; side < lo || side > hi {
			t.Errorf("window %d: the RLQS side admitted %d of %d, want 3/5 within ±20 %% (%d to %d)", i, side, total, lo, hi)
		}
		for src := range f.rlqs {
			if c[src] == 0 {
				t.Errorf("window %d: %s admitted nothing", i, src)
			}
		}
	}
}
