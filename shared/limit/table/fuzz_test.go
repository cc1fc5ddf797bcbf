package table

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// FuzzTable feeds arbitrary bucket bytes to Lookup, Decide and Commit: nothing may
// panic; a non-OK bucket reads as an empty table; the committed bucket is OK, holds
// the key at the slot Lookup chose with the state Decide wrote (or the overflow record
// holds it), and keeps every other record of an OK bucket byte for byte.
func FuzzTable(f *testing.F) {
	ly := newLayout(f, limit.Config{Algorithm: limit.TokenBucket, Limit: 5, Window: 15 * time.Second}, 3)
	good, _, _ := hit(f, ly, nil, 1, t0)
	good, _, _ = hit(f, ly, good, 2, t0)
	f.Add([]byte{}, uint64(1), t0)
	f.Add(good, uint64(2), t0)
	f.Add(good, uint64(0), int64(-1))
	f.Fuzz(func(t *testing.T, bucket []byte, key uint64, now int64) {
		orig := string(bucket)
		s := ly.Lookup(bucket, key, now)
		if string(bucket) != orig {
			t.Fatal("Lookup modified the bucket")
		}
		if s.Index < 0 || s.Index > ly.Entries() || (s.Index == ly.Entries()) != s.Overflow {
			t.Fatalf("index %d, overflow %v", s.Index, s.Overflow)
		}
		if s.Status != OK && (s.Found || s.State != nil || s.Overflow) {
			t.Fatalf("non-OK bucket not empty: %+v", s)
		}
		next := make([]byte, ly.Limiter().StateSize())
		ly.Limiter().Decide(s.State, next, now, 1)
		out := ly.Commit(make([]byte, ly.Size()), bucket, s, key, next, now)
		if s.Overflow {
			if k, _, st, ok := ly.Entry(out, s.Index); !ok || k != 0 || string(st) != string(next) {
				t.Fatalf("overflow after commit: %d % x", k, st)
			}
		} else if st := ly.Lookup(out, key, now); st.Status != OK || !st.Found || st.Index != s.Index || string(st.State) != string(next) {
			t.Fatalf("after commit: %+v", st)
		}
		if s.Status == OK {
			for i := 0; i <= ly.Entries(); i++ {
				if i == s.Index {
					continue
				}
				k1, a1, s1, _ := ly.Entry(bucket, i)
				k2, a2, s2, _ := ly.Entry(out, i)
				if k1 != k2 || a1 != a2 || string(s1) != string(s2) {
					t.Fatalf("entry %d changed", i)
				}
			}
		}
	})
}
