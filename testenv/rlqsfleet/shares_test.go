package rlqsfleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisproc"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
	"github.com/sluice-proxy/sluice/testenv/rlqsclient"
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
	settings := bucketSettings(t, a, "hot", 250*time.Millisecond)
	wasm := map[string]*host.Host{"wasm-a": wasmEnvoy(t, a.addr, v), "wasm-b": wasmEnvoy(t, b.addr, v)}
	rlqs := map[string]*rlqsclient.Client{"rlqs-a1": rlqsEnvoy(t, a.grpcAddr, settings), "rlqs-b": rlqsEnvoy(t, b.grpcAddr, settings),
		"rlqs-a2": rlqsEnvoy(t, a.grpcAddr, settings)}
	id := map[string]string{"policy": policyName, "rule": "hot", "user": "hot"}

	adm := &admissions{at: map[string][]int64{}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	pace := func(src string, try func() bool) {
		defer wg.Done()
		tk := time.NewTicker(30 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				if try() {
					adm.add(src)
				}
			}
		}
	}
	for src, h := range wasm {
		wg.Add(1)
		go pace(src, func() bool {
			r, err := h.Worker(0).Do(ctx, host.Request{Path: "/hot", Headers: host.Headers{{"x-user-id", "hot"}}})
			return err == nil && r.Status == 200
		})
	}
	for src, c := range rlqs {
		wg.Add(1)
		go pace(src, func() bool { return c.Decide(id) })
	}
	start := time.Now()
	// The first window after start is a warm-up (streams open, first
	// assignments); three full windows follow.
	first := (start.UnixNano()/int64(window) + 2) * int64(window)
	select {
	case <-time.After(time.Until(time.Unix(0, first+3*int64(window)))): // the run's length, traffic meanwhile
	case <-ctx.Done():
	}
	stop()
	wg.Wait()

	starts, counts := adm.perWindow(first-1, first+3*int64(window))
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
		for src := range rlqs {
			if c[src] == 0 {
				t.Errorf("window %d: %s admitted nothing", i, src)
			}
		}
	}
}
