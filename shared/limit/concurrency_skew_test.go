package limit

import (
	"testing"
	"time"
)

// TestConcurrencyClockOrderDiffersFromCommitOrder: worker A reads the clock
// at t+1ms and commits its slot first; worker B read the clock at t, before
// A, and decides on A's state afterwards. B must count A's slot as held (its
// expiry is t+1ms+Lease, a little more than one Lease ahead of B's now)
// rather than read it as garbage, zero it and admit one request too many.
func TestConcurrencyClockOrderDiffersFromCommitOrder(t *testing.T) {
	l, err := New(Config{Algorithm: Concurrency, Limit: 1, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := int64(1_700_000_000) * int64(time.Second)
	a := make([]byte, l.StateSize())
	if d := l.Decide(nil, a, t0+int64(time.Millisecond), 1); !d.Allowed {
		t.Fatalf("A: %+v, want allowed", d)
	}
	b := make([]byte, l.StateSize())
	if d := l.Decide(a, b, t0, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("B (clock read before A's, decided after A's commit): %+v, want denied with 0 remaining", d)
	}
	// A's release, whenever it comes, still frees exactly A's slot.
	r := make([]byte, l.StateSize())
	l.Release(a, r, t0+int64(2*time.Millisecond), t0+int64(time.Millisecond), 1)
	if d := l.Decide(r, b, t0, 1); !d.Allowed {
		t.Fatalf("after A's release: %+v, want allowed", d)
	}
	// Garbage far ahead still reads as free.
	far := make([]byte, l.StateSize())
	st64(far, 0, uint64(t0+int64(3*time.Minute)))
	if d := l.Decide(far, b, t0, 1); !d.Allowed {
		t.Fatalf("expiry three leases ahead: %+v, want read as free", d)
	}
}
