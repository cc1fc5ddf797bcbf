package rlqs

import (
	"slices"
	"testing"
	"time"
)

// runOffered sends the fleet offered requests per window of w, spread evenly over
// time and over the Envoys, Envoy i starting at phase[i] (so its reports fall
// there, Envoy reporting from its first request), for d.
func (s *sim) runOffered(d, w time.Duration, offered int, phase []time.Duration, id map[string]string) {
	n := len(s.envoys)
	gap := w / time.Duration(offered) // between two requests of the fleet
	const step = 10 * time.Millisecond
	next := make([]time.Duration, n)
	start := s.clk.Now()
	for i := range next {
		next[i] = start + phase[i]
	}
	each := gap * time.Duration(n) // between two requests of one Envoy
	for end := start + d; s.clk.Now() < end; {
		s.clk.Advance(step)
		for i, c := range s.envoys {
			for next[i] <= s.clk.Now() {
				next[i] += each
				if c.Decide(id) {
					s.admitted = append(s.admitted, s.unix())
					s.by = append(s.by, i)
				}
			}
		}
	}
}

// TestAdmittedPerWindowAtEnvoysCadence: Envoys reporting every 5 s, as Envoy's
// quota filter does, or every second, offered twice the limit, never admit more
// than the limit in a window, and every full window after the first admits at
// least 95 % of it. 5 s windows are reported, not asserted beyond the limit: a
// 5 s report reaches a 5 s window once (docs/rlqs.md, "At Envoy's cadence").
func TestAdmittedPerWindowAtEnvoysCadence(t *testing.T) {
	for _, w := range []struct {
		rule     string
		window   time.Duration
		asserted bool
	}{
		{"w10", 10 * time.Second, true},
		// on_quota_failure "local", the default: units admitted without an
		// assignment are charged, and units an assignment admitted never are.
		{"w10local", 10 * time.Second, true},
		{"w60", time.Minute, true},
		{"w5", 5 * time.Second, false},
	} {
		for _, n := range []int{4, 32} {
			for _, every := range []time.Duration{5 * time.Second, time.Second} {
				for _, layout := range []string{"spread", "aligned"} {
					s := newSimEvery(t, n, 20*time.Millisecond, w.rule, every)
					phase := make([]time.Duration, n)
					for i := range phase {
						if layout == "spread" {
							phase[i] = every * time.Duration(i) / time.Duration(n)
						}
					}
					id := map[string]string{"policy": "p", "rule": w.rule, "user": "hot"}
					s.runOffered(6*w.window+2*every, w.window, 200, phase, id)
					ws := s.perWindow(w.window, s.unix())
					for i, got := range ws {
						if got > 100 {
							t.Errorf("%s N=%d every %v %s: window %d admitted %d > 100", w.rule, n, every, layout, i, got)
						}
					}
					if full := slices.Min(ws[1:]); w.asserted && full < 95 {
						t.Errorf("%s N=%d every %v %s: full windows admitted %v of 100: want at least 95 in every one", w.rule, n, every, layout, ws[1:])
					}
					t.Logf("%s N=%d reports every %v, phases %s: admitted per window %v (limit 100, offered 200); fewest by one Envoy %v",
						w.rule, n, every, layout, ws, s.fewestPerWindow(w.window, s.unix()))
				}
			}
		}
	}
}

// TestATokenBucketAtEnvoysCadenceNeverPassesItsBound: Envoys reporting every
// 5 s, as Envoy's quota filter does, offered twice a token bucket's rate (10 a
// second, burst 50) on one key, at any report phase, never admit more than the
// bucket's capacity plus its refill over any span. The rate they reach is
// reported, not asserted: a lease lasts at most V = k·window/limit (2.5 s here,
// docs/fleet.md), shorter than Envoy's report interval, so an Envoy's assignment
// ends before its next report and what the global bucket refills past C−k
// meanwhile is lost (docs/rlqs.md, "Token buckets at Envoy's cadence").
func TestATokenBucketAtEnvoysCadenceNeverPassesItsBound(t *testing.T) {
	const rate, burst = 10, 50
	for _, n := range []int{4, 32} {
		for _, layout := range []string{"spread", "aligned"} {
			every := 5 * time.Second
			s := newSimEvery(t, n, 20*time.Millisecond, "tb10", every)
			phase := make([]time.Duration, n)
			for i := range phase {
				if layout == "spread" {
					phase[i] = every * time.Duration(i) / time.Duration(n)
				}
			}
			id := map[string]string{"policy": "p", "rule": "tb10", "user": "hot"}
			const run = 120 * time.Second
			s.runOffered(run, time.Second, 2*rate, phase, id)
			for _, span := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second} {
				if got, most := maxIn(append([]int64(nil), s.admitted...), span), burst+int(rate*span/time.Second); got > most {
					t.Errorf("N=%d %s: %d admitted in %v, over the bound %d", n, layout, got, span, most)
				}
			}
			// The rate over the run, the first burst left out.
			got := float64(len(s.admitted)-burst) / run.Seconds()
			t.Logf("N=%d reports every %v, phases %s: %.1f a second of %d (%.0f %%)", n, every, layout, got, rate, 100*got/rate)
			if got <= 0 {
				t.Errorf("N=%d %s: nothing admitted past the first burst", n, layout)
			}
		}
	}
}
