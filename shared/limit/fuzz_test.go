package limit

import "testing"

// FuzzDecide runs every method of one of allConfigs' limiters on arbitrary state
// bytes, time, cost and delta: nothing may panic, the Decision must be consistent
// (see exercise), Decide must be deterministic and must not modify state, and the
// state it writes must decode to what Decide reported.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(0), []byte{}, int64(0), uint64(1), int64(0))
	f.Add(uint8(3), make([]byte, 48), t0, uint64(100), int64(-5))
	f.Add(uint8(7), []byte{1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, int64(-1), uint64(1<<63), int64(-1<<63))
	configs := allConfigs()
	limiters := make([]Limiter, len(configs))
	for i, c := range configs {
		limiters[i] = mustNew(f, c)
	}
	f.Fuzz(func(t *testing.T, which uint8, state []byte, now int64, cost uint64, delta int64) {
		l := limiters[int(which)%len(limiters)]
		orig := string(state)
		next := make([]byte, l.StateSize())
		next2 := make([]byte, l.StateSize())
		d1 := l.Decide(state, next, now, cost)
		d2 := l.Decide(state, next2, now, cost)
		if d1 != d2 || string(next) != string(next2) {
			t.Fatalf("Decide not deterministic: %+v vs %+v", d1, d2)
		}
		if string(state) != orig {
			t.Fatal("Decide modified state")
		}
		// next decodes to what Decide reported: a probe on it sees the same
		// Remaining and Reset, and writes the same state back.
		p := l.Decide(next, next2, now, 0)
		if p.Remaining != d1.Remaining || p.Reset != d1.Reset || string(next2) != string(next) {
			t.Fatalf("re-decode differs: %+v after %+v", p, d1)
		}
		exercise(l, state, next, now, cost, delta)
		if string(state) != orig {
			t.Fatal("a method modified state")
		}
	})
}
