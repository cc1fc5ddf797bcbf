package rls

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestAKeyFarFromItsLimitIsAskedForAboutOnceAWindow: one replica, a key of
// 100,000 a second, and a demand that scatters from 20 to 40 calls a window
// at random moments (a third either side of 30, as a key's share of a load
// spread over many keys scatters). Over 40 windows after the first two, the replica asks the
// quota service (a store round each) at most 1.15 times a window: the ask
// that opens a window holds enough for the window's rest, so refills are
// rare. Every call is admitted.
func TestAKeyFarFromItsLimitIsAskedForAboutOnceAWindow(t *testing.T) {
	const doc = `{"policy":"f","rules":[{"id":"far","descriptor":{"domain":"f","entries":[{"key":"k","value":"v"}]},"algorithm":"fixed_window","limit":100000,"window":"1s","scope":"fleet"}]}`
	f := newFixture(t, doc)
	r := f.replica(t, "a", "", func(o *Options) { o.InlineRefills = true })
	rng := rand.New(rand.NewPCG(7, 11))
	asks := func() float64 { return counterWith(t, r.reg, "sluice_controlplane_rls_asks_total", "", "") }
	window := func() {
		n := 20 + rng.IntN(21)
		at := make([]time.Duration, n)
		for i := range at {
			at[i] = time.Duration(rng.Int64N(int64(time.Second)))
		}
		slices.Sort(at)
		var now time.Duration
		for _, a := range at {
			f.clk.advance(a - now)
			now = a
			if c := r.call(t, "f", desc("k", "v")).OverallCode; c != rlsv3.RateLimitResponse_OK {
				t.Fatalf("a call of a key far from its limit answered %v", c)
			}
		}
		f.clk.advance(time.Second - now)
	}
	window()
	window()
	before := asks()
	const windows = 40
	for range windows {
		window()
	}
	got := (asks() - before) / windows
	t.Logf("%.2f asks a window", got)
	if got > 1.15 {
		t.Errorf("%.2f asks a window, want at most 1.15", got)
	}
}
