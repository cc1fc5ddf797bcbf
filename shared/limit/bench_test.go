package limit

import (
	"testing"
	"time"
)

// benchConfigs are the configurations measured by BenchmarkDecide.
var benchConfigs = []struct {
	name string
	cfg  Config
}{
	{"token_bucket", Config{Algorithm: TokenBucket, Limit: 100, Window: time.Second}},
	{"gcra", Config{Algorithm: GCRA, Limit: 100, Window: time.Second, Burst: 10}},
	{"time_wheel/10", Config{Algorithm: TimeWheel, Limit: 100, Window: 10 * time.Second, Slots: 10}},
	{"time_wheel/60", Config{Algorithm: TimeWheel, Limit: 1000, Window: time.Minute, Slots: 60}},
	{"fixed_window", Config{Algorithm: FixedWindow, Limit: 100, Window: time.Minute}},
	{"fixed_window/calendar_day", Config{Algorithm: FixedWindow, Limit: 100, CalendarDay: true, Location: time.FixedZone("UTC-5", -5*3600)}},
	{"sliding_log/10", Config{Algorithm: SlidingLog, Limit: 10, Window: time.Second}},
	{"sliding_log/64", Config{Algorithm: SlidingLog, Limit: 64, Window: 10 * time.Second}},
	{"concurrency/10", Config{Algorithm: Concurrency, Limit: 10, Lease: time.Minute}},
	{"concurrency/64", Config{Algorithm: Concurrency, Limit: 64, Lease: time.Minute}},
}

// BenchmarkDecide measures one decision on a key with history (about half its limit
// or bucket used): Decide on the stored state into next, as the filter does for each rule before
// it knows whether to commit. allocs/op must be 0.
func BenchmarkDecide(b *testing.B) {
	for _, bc := range benchConfigs {
		b.Run(bc.name, func(b *testing.B) {
			l := mustNew(b, bc.cfg)
			state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
			now := t0
			half := l.Config().Limit / 2
			if capacity := l.Config().capacity(); capacity != 0 {
				half = capacity / 2
			}
			for i := uint64(0); i < half; i++ {
				now += int64(time.Millisecond)
				if l.Decide(state, next, now, 1).Allowed {
					state, next = next, state
				}
			}
			b.ReportAllocs()
			var allowed int
			for b.Loop() {
				if l.Decide(state, next, now, 1).Allowed {
					allowed++
				}
			}
			if allowed == 0 {
				b.Fatal("benchmark decided nothing allowed")
			}
		})
	}
}

// BenchmarkDecideCommit measures a stream of requests 1ms apart, each committed when
// allowed (the state evolves: rotations, refills, ring writes).
func BenchmarkDecideCommit(b *testing.B) {
	for _, bc := range benchConfigs {
		b.Run(bc.name, func(b *testing.B) {
			l := mustNew(b, bc.cfg)
			state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now += int64(time.Millisecond)
				if l.Decide(state, next, now, 1).Allowed {
					state, next = next, state
				}
			}
		})
	}
}
