package limit

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestAccuracy prints, for each algorithm at 50 requests per 1s, the worst number
// admitted in any interval of length Window (any alignment, brute force over the
// admitted timeline) under three traffic shapes, next to the documented bound, and
// fails if a bound is broken. Run with -v to see the table.
//
//   - steady: Poisson arrivals at 3× the limit for 60 s
//   - bursty: bursts of 75 requests within 1 ms at random times, ~2 per second, 60 s
//   - boundary: 75 requests in the last 50 ms before each whole second and 75 in the
//     first 50 ms after it, every 3 s, for 60 s
func TestAccuracy(t *testing.T) {
	const limitN = 50
	w := time.Second
	cfgs := []struct {
		cfg   Config
		bound int // worst count in any interval of length Window, documented
	}{
		{Config{Algorithm: TokenBucket, Limit: limitN, Window: w}, 2 * limitN},             // capacity + rate·W
		{Config{Algorithm: GCRA, Limit: limitN, Window: w, Burst: limitN - 1}, 2 * limitN}, // burst+1 + rate·W
		{Config{Algorithm: GCRA, Limit: limitN, Window: w, Burst: 9}, limitN + 10},
		{Config{Algorithm: TimeWheel, Limit: limitN, Window: w, Slots: 10}, 2 * limitN}, // L + oldest partial slot
		{Config{Algorithm: TimeWheel, Limit: limitN, Window: w, Slots: 60}, 2 * limitN},
		{Config{Algorithm: FixedWindow, Limit: limitN, Window: w}, 2 * limitN},
		{Config{Algorithm: SlidingLog, Limit: limitN, Window: w}, limitN},
	}
	shapes := []struct {
		name string
		gen  func(rng *rand.Rand) []int64
	}{
		{"steady", func(rng *rand.Rand) []int64 {
			var ts []int64
			for at := t0; at < t0+int64(60*time.Second); at += int64(rng.ExpFloat64() * float64(w) / (3 * limitN)) {
				ts = append(ts, at)
			}
			return ts
		}},
		{"bursty", func(rng *rand.Rand) []int64 {
			var ts []int64
			for at := t0; at < t0+int64(60*time.Second); at += int64(rng.ExpFloat64() * float64(w) / 2) {
				for i := 0; i < 3*limitN/2; i++ {
					ts = append(ts, at+int64(i)*int64(time.Millisecond)/(3*limitN/2))
				}
			}
			return ts
		}},
		{"boundary", func(rng *rand.Rand) []int64 {
			var ts []int64
			for s := int64(3); s < 60; s += 3 {
				edge := t0 + s*int64(time.Second)
				for i := int64(0); i < 3*limitN/2; i++ {
					ts = append(ts, edge-int64(50*time.Millisecond)+i*int64(50*time.Millisecond)/(3*limitN/2))
				}
				for i := int64(0); i < 3*limitN/2; i++ {
					ts = append(ts, edge+i*int64(50*time.Millisecond)/(3*limitN/2))
				}
			}
			return ts
		}},
	}
	t.Logf("%-30s %8s %8s %8s %6s", "algorithm (50 per 1s)", "steady", "bursty", "boundary", "bound")
	for _, c := range cfgs {
		l := mustNew(t, c.cfg)
		row := ""
		for _, sh := range shapes {
			ts := sh.gen(rand.New(rand.NewPCG(5, 6)))
			state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
			var admitted []int64
			for _, at := range ts {
				if l.Decide(state, next, at, 1).Allowed {
					admitted = append(admitted, at)
					state, next = next, state
				}
			}
			worst := worstWindow(admitted, int64(w))
			if worst > c.bound {
				t.Errorf("%v %s: %d admitted in one window, bound %d", c.cfg.Algorithm, sh.name, worst, c.bound)
			}
			row += " " + pad(strconv.Itoa(worst)+"/"+strconv.Itoa(len(admitted)), 8)
		}
		name := c.cfg.Algorithm.String()
		switch {
		case c.cfg.Slots != 0:
			name += " slots=" + strconv.Itoa(int(c.cfg.Slots))
		case c.cfg.Algorithm == GCRA:
			name += " burst=" + strconv.Itoa(int(c.cfg.Burst))
		}
		t.Logf("%-30s%s %6d", name, row, c.bound)
	}
	t.Log("cells: worst count in any 1s interval / total admitted in 60s")
}

// worstWindow returns the largest number of sorted times within any half-open interval
// of length w.
func worstWindow(ts []int64, w int64) int {
	worst, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w {
			j++
		}
		worst = max(worst, i-j+1)
	}
	return worst
}

func pad(s string, n int) string {
	for len(s) < n {
		s = " " + s
	}
	return s
}
