package limit

import (
	"testing"
	"time"
)

// TestMaximalDebtSeenEarlierStaysEmpty: a token_bucket charged to its deepest debt
// (cost capacity, then Adjust by +capacity) and read by a worker whose clock reads a
// little earlier must stay empty, not read as a fresh, full bucket.
func TestMaximalDebtSeenEarlierStaysEmpty(t *testing.T) {
	l := mustNew(t, Config{Algorithm: TokenBucket, Limit: 10, Window: time.Second})
	a := make([]byte, tatSize)
	if d := l.Decide(nil, a, t0, 10); !d.Allowed {
		t.Fatalf("cost 10: %+v", d)
	}
	b := make([]byte, tatSize)
	l.Adjust(a, b, t0, 10)
	next := make([]byte, tatSize)
	for _, skew := range []time.Duration{1, time.Microsecond, time.Millisecond, time.Second, 30 * time.Second} {
		now := t0 - int64(skew)
		if d := l.Decide(b, next, now, 1); d.Allowed || d.Remaining != 0 {
			t.Errorf("read %v earlier: %+v, want denied with 0 remaining", skew, d)
		}
		if l.Idle(b, now) {
			t.Errorf("read %v earlier: Idle, want live", skew)
		}
		// A further charge seen from the earlier clock keeps the debt, never resets it.
		l.Adjust(b, next, now, 5)
		if d := l.Decide(next, make([]byte, tatSize), t0, 1); d.Allowed || d.Remaining != 0 {
			t.Errorf("charged %v earlier: %+v, want still denied", skew, d)
		}
	}
	// At t0 the debt is two seconds: one second later the bucket holds nothing yet,
	// two seconds later it is full.
	if d := l.Decide(b, next, t0+int64(time.Second), 1); d.Allowed {
		t.Errorf("1s later: %+v, want denied", d)
	}
	if d := l.Decide(b, next, t0+int64(2*time.Second), 10); !d.Allowed {
		t.Errorf("2s later: %+v, want allowed", d)
	}
}

// TestGCRADelayedWorkerSeesEmptyKey: gcra 1000/s (one request per ms, no burst): a
// worker whose clock reading is 1.5 ms older than the commit it decides on sees a TAT
// 2.5 ms ahead, more than the deepest debt (2 ms); it must still see an empty key.
func TestGCRADelayedWorkerSeesEmptyKey(t *testing.T) {
	l := mustNew(t, Config{Algorithm: GCRA, Limit: 1000, Window: time.Second})
	a := make([]byte, tatSize)
	if d := l.Decide(nil, a, t0, 1); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	next := make([]byte, tatSize)
	for _, late := range []time.Duration{1500 * time.Microsecond, 10 * time.Millisecond, 20 * time.Second} {
		if d := l.Decide(a, next, t0-int64(late), 1); d.Allowed {
			t.Errorf("worker %v behind: %+v, want denied", late, d)
		}
	}
}

// TestTATGarbageFarAheadReadsFresh: what no clock skew explains (a TAT beyond the
// deepest debt plus the skew allowance) still reads as a fresh key.
func TestTATGarbageFarAheadReadsFresh(t *testing.T) {
	l := mustNew(t, Config{Algorithm: TokenBucket, Limit: 10, Window: time.Second})
	far := make([]byte, tatSize)
	st64(far, 0, uint64(t0+int64(2*time.Second+tatSkew+time.Nanosecond)))
	if d := l.Decide(far, make([]byte, tatSize), t0, 10); !d.Allowed {
		t.Fatalf("garbage far ahead: %+v, want read as fresh", d)
	}
	edge := make([]byte, tatSize)
	st64(edge, 0, uint64(t0+int64(2*time.Second+tatSkew)))
	if d := l.Decide(edge, make([]byte, tatSize), t0, 1); d.Allowed {
		t.Fatalf("at the edge of the allowance: %+v, want denied", d)
	}
}
