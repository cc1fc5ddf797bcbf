package table

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// everyAlgorithm is one configuration of each algorithm, with its limit in cost units
// over the span of the saturation tests (a few seconds, far below every window).
var everyAlgorithm = []struct {
	name  string
	cfg   limit.Config
	bound int
}{
	{"token_bucket", limit.Config{Algorithm: limit.TokenBucket, Limit: 100, Window: time.Hour}, 100},
	{"gcra", limit.Config{Algorithm: limit.GCRA, Limit: 100, Window: time.Hour, Burst: 99}, 100},
	{"fixed_window", limit.Config{Algorithm: limit.FixedWindow, Limit: 100, Window: time.Hour}, 100},
	{"calendar_day", limit.Config{Algorithm: limit.FixedWindow, Limit: 100, CalendarDay: true}, 100},
	{"time_wheel", limit.Config{Algorithm: limit.TimeWheel, Limit: 100, Window: time.Hour, Slots: 10}, 100},
	{"sliding_log", limit.Config{Algorithm: limit.SlidingLog, Limit: 50, Window: time.Hour}, 50},
	{"concurrency", limit.Config{Algorithm: limit.Concurrency, Limit: 10, Lease: time.Hour}, 10},
}

// fill makes every entry of a bucket live: one request each of keys 1..entries.
func fill(t testing.TB, ly *Layout, at int64) []byte {
	t.Helper()
	var b []byte
	for k := 1; k <= ly.Entries(); k++ {
		var d limit.Decision
		b, _, d = hit(t, ly, b, uint64(k), at)
		if !d.Allowed {
			t.Fatalf("filling: key %d denied", k)
		}
	}
	return b
}

// TestAlternatingKeysStayLimited: with every entry of a bucket live, two keys without
// an entry that take turns must each stay within their limit: a key that had no entry,
// or lost it, must never start again with a fresh budget.
func TestAlternatingKeysStayLimited(t *testing.T) {
	for _, tc := range everyAlgorithm {
		t.Run(tc.name, func(t *testing.T) {
			for _, entries := range []int{1, 4} {
				ly := newLayout(t, tc.cfg, entries)
				b := fill(t, ly, t0)
				admitted := map[uint64]int{}
				for i := 0; i < 3*tc.bound; i++ {
					for _, key := range []uint64{1001, 1002} {
						var d limit.Decision
						b, _, d = hit(t, ly, b, key, t0+int64(i+1)*int64(time.Millisecond))
						if d.Allowed {
							admitted[key]++
						}
					}
				}
				for key, n := range admitted {
					if n > tc.bound {
						t.Errorf("%d entries: key %d admitted %d times, limit %d", entries, key, n, tc.bound)
					}
				}
				if len(b) != ly.Size() {
					t.Errorf("bucket is %d bytes, want %d", len(b), ly.Size())
				}
			}
		})
	}
}

// TestFloodOfNewKeysKeepsKeyLimited: a key at its limit stays limited while a flood of
// distinct new keys (a million) passes through its bucket, and the bucket keeps its configured size.
func TestFloodOfNewKeysKeepsKeyLimited(t *testing.T) {
	for _, tc := range everyAlgorithm {
		t.Run(tc.name, func(t *testing.T) {
			n := 1_000_000
			if testing.Short() {
				n = 20_000
			}
			ly := newLayout(t, tc.cfg, 16)
			const target = 77
			var b []byte
			for i := 0; i < tc.bound; i++ {
				var d limit.Decision
				if b, _, d = hit(t, ly, b, target, t0); !d.Allowed {
					t.Fatalf("request %d of the target denied", i)
				}
			}
			next := make([]byte, ly.Limiter().StateSize())
			dst := make([]byte, ly.Size())
			for i := 0; i < n; i++ {
				now := t0 + int64(i)*int64(time.Microsecond) // a million keys in one second
				key := uint64(1_000_000 + i)
				s := ly.Lookup(b, key, now)
				if ly.Limiter().Decide(s.State, next, now, 1).Allowed {
					out := ly.Commit(dst, b, s, key, next, now)
					b, dst = out, b
				}
				if i%1000 == 999 {
					s := ly.Lookup(b, target, now)
					if d := ly.Limiter().Decide(s.State, next, now, 1); d.Allowed {
						t.Fatalf("after %d new keys the target at its limit was admitted (slot %+v)", i+1, s)
					}
				}
				if len(b) != ly.Size() {
					t.Fatalf("bucket is %d bytes, want %d", len(b), ly.Size())
				}
			}
		})
	}
}

// TestTableNeverUndercounts: many keys over a small table at random times and costs,
// for every algorithm. Each key also has its own exact state, fed with exactly the
// requests the table admitted for it; whenever the table admits a request, that exact
// state must admit it too (the table may deny more, never admit more).
func TestTableNeverUndercounts(t *testing.T) {
	for _, tc := range everyAlgorithm {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			lim := tc.cfg
			ly := newLayout(t, lim, 3)
			l := ly.Limiter()
			exact := map[uint64][]byte{}
			var b []byte
			now := t0
			next := make([]byte, l.StateSize())
			ref := make([]byte, l.StateSize())
			admitted, overflow := 0, 0
			for i := 0; i < 20_000; i++ {
				// Five keys of twelve are active in each phase of 2000 requests (about
				// an hour): they exceed their limits, fill the entries and the overflow;
				// the others go idle and come back in a later phase.
				now += int64(rng.ExpFloat64() * float64(2*time.Second))
				key := uint64((i/2000*5+rng.IntN(5))%12) + 1
				cost := uint64(rng.IntN(3))
				s := ly.Lookup(b, key, now)
				if s.Overflow {
					overflow++
				}
				d := l.Decide(s.State, next, now, cost)
				if !d.Allowed {
					continue
				}
				admitted++
				if rd := l.Decide(exact[key], ref, now, cost); !rd.Allowed {
					t.Fatalf("request %d: key %d cost %d admitted by the table (slot %+v) but not by its exact state", i, key, cost, s)
				}
				exact[key] = append(exact[key][:0], ref...)
				b = ly.Commit(make([]byte, ly.Size()), b, s, key, next, now)
			}
			if admitted == 0 || overflow == 0 {
				t.Fatalf("admitted %d, overflow decisions %d: the test exercises nothing", admitted, overflow)
			}
		})
	}
}
