package limit

import (
	"testing"
	"time"
)

// adjustStep is either a Decide (cost) or an Adjust (delta, when isAdjust).
type adjustStep struct {
	at       time.Duration
	isAdjust bool
	delta    int64
	cost     uint64
	want     Decision // for Decide steps
}

func runAdjust(t *testing.T, c Config, steps []adjustStep) {
	t.Helper()
	l := mustNew(t, c)
	st, nx := make([]byte, l.StateSize()), make([]byte, l.StateSize())
	for i, s := range steps {
		now := t0 + int64(s.at)
		if s.isAdjust {
			if !l.Adjust(st, nx, now, s.delta) {
				t.Fatalf("step %d: Adjust unsupported", i)
			}
			st, nx = nx, st
			continue
		}
		if got := l.Decide(st, nx, now, s.cost); got != s.want {
			t.Fatalf("step %d (at %v cost %d): got %+v, want %+v", i, s.at, s.cost, got, s.want)
		} else if got.Allowed {
			st, nx = nx, st
		}
	}
}

func adj(at time.Duration, delta int64) adjustStep {
	return adjustStep{at: at, isAdjust: true, delta: delta}
}
func dec(at time.Duration, cost uint64, want Decision) adjustStep {
	return adjustStep{at: at, cost: cost, want: want}
}

func TestAdjustTimeWheel(t *testing.T) {
	runAdjust(t, Config{Algorithm: TimeWheel, Limit: 10, Window: 10 * sec, Slots: 10}, []adjustStep{
		dec(500*ms, 4, allow(10, 6, 9500*ms)),
		adj(500*ms, 5), // the response said 9
		dec(1500*ms, 2, deny(10, 1, 8500*ms, 8500*ms)),
		adj(2*sec, -3), // refund from the newest slots back: slot 2 (0), 1 (0), 0 (9→6)
		dec(2*sec, 2, allow(10, 2, 10*sec)),
		adj(3*sec, -100), // never below zero
		dec(3*sec, 10, allow(10, 0, 10*sec)),
		adj(3*sec, 1<<40),                          // a slot saturates at 2^32-1
		dec(3*sec, 0, deny(10, 0, 10*sec, 10*sec)), // a probe is denied while over-spent
		dec(13*sec, 10, allow(10, 0, 10*sec)),
	})
}

func TestAdjustFixedWindow(t *testing.T) {
	runAdjust(t, Config{Algorithm: FixedWindow, Limit: 5, Window: 10 * sec}, []adjustStep{
		dec(1*sec, 3, allow(5, 2, 9*sec)),
		adj(1*sec, 4), // count 7 > limit: the window is over-spent
		dec(2*sec, 1, deny(5, 0, 8*sec, 8*sec)),
		adj(2*sec, -10), // never below zero
		dec(2*sec, 5, allow(5, 0, 8*sec)),
		adj(12*sec, -2), // after the window ended: applies to the new window (count 0)
		dec(12*sec, 5, allow(5, 0, 8*sec)),
		adj(12*sec, 3),
		dec(12*sec, 0, deny(5, 0, 8*sec, 8*sec)),
	})
}

func TestAdjustGCRA(t *testing.T) {
	runAdjust(t, Config{Algorithm: GCRA, Limit: 10, Window: 10 * sec, Burst: 4}, []adjustStep{
		dec(0, 1, allow(5, 4, sec)),
		adj(0, 2), // 3 units taken: 3s of debt
		dec(0, 2, allow(5, 0, 5*sec)),
		dec(0, 1, deny(5, 0, 5*sec, sec)),
		adj(0, -2),
		dec(0, 2, allow(5, 0, 5*sec)),
	})
}

func TestUnsupportedOps(t *testing.T) {
	for _, c := range allConfigs() {
		l := mustNew(t, c)
		st := make([]byte, l.StateSize())
		st[0] = 7
		nx := make([]byte, l.StateSize())
		alg := c.Algorithm
		if got := l.Adjust(st, nx, t0, 1); got != (alg != SlidingLog && alg != Concurrency) {
			t.Errorf("%v: Adjust supported = %v", alg, got)
		}
		if got := l.Release(st, nx, t0, t0, 1); got != (alg == Concurrency) {
			t.Errorf("%v: Release supported = %v", alg, got)
		}
		if alg != Concurrency && string(nx) != string(st) {
			t.Errorf("%v: unsupported Release did not copy state", alg)
		}
	}
}
