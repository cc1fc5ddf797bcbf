package limit

import (
	"testing"
	"time"
)

// t0 is a virtual start time: Unix 1700000100 s, a multiple of 1, 3, 5, 10 and 15 s,
// so epoch-aligned windows and slots begin exactly at t0.
const t0 = int64(1_700_000_100) * int64(time.Second)

// step is one request of a scripted timeline: at is the time since t0.
type step struct {
	at   time.Duration
	cost uint64
	want Decision
}

func mustNew(t testing.TB, c Config) Limiter {
	t.Helper()
	l, err := New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return l
}

// runSteps feeds steps to a fresh key of c in order, committing next when allowed, and
// checks every Decision exactly. It returns the final state.
func runSteps(t *testing.T, c Config, steps []step) []byte {
	t.Helper()
	l := mustNew(t, c)
	state := make([]byte, l.StateSize())
	next := make([]byte, l.StateSize())
	for i, s := range steps {
		got := l.Decide(state, next, t0+int64(s.at), s.cost)
		if got != s.want {
			t.Fatalf("step %d (at %v, cost %d): got %+v, want %+v", i, s.at, s.cost, got, s.want)
		}
		if got.Allowed {
			state, next = next, state
		}
	}
	return state
}

// allow and deny build expected Decisions.
func allow(limit, remaining uint64, reset time.Duration) Decision {
	return Decision{Allowed: true, Limit: limit, Remaining: remaining, Reset: reset}
}

func deny(limit, remaining uint64, reset, retry time.Duration) Decision {
	return Decision{Limit: limit, Remaining: remaining, Reset: reset, RetryAfter: retry}
}

const (
	ms  = time.Millisecond
	sec = time.Second
)
