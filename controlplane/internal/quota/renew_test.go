package quota

import (
	"testing"
	"time"
)

// TestABucketLeaseAskedForNearItsEndIsRenewed: a token bucket's lease keeps the
// end of its first grant while it holds units (later grants join it, so no unit
// outlives its lease), so a key in steady use never emptied its lease and lost
// it, and its requests waited, at every end. An ask within two report intervals
// of the end starts a lease of its own: what the Envoy still held is given up,
// as at the end, and the grant holds alone until a full validity later. An ask
// earlier keeps the end.
func TestABucketLeaseAskedForNearItsEndIsRenewed(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	s := newService(t, NewMemory(), newPolicies(t), clk)
	e := newEnvoys(1)[0]
	key := globalKey("tb")
	first := ask(t, s, e, "tb", key, 0, 0, 50)
	if first.Granted != 50 || first.ExpiresIn <= 3*time.Second {
		t.Fatalf("first grant: %+v", first)
	}
	end := clk.Now() + int64(first.ExpiresIn)

	clk.add(time.Second)
	r := ask(t, s, e, "tb", key, 20, 0, 50)
	if r.Granted == 0 || r.Held != 30+r.Granted || clk.Now()+int64(r.ExpiresIn) != end {
		t.Fatalf("an ask 1 s in: granted %d, held %d until +%v; want the 30 left joined by the grant until the first end (+%v)",
			r.Granted, r.Held, r.ExpiresIn, time.Duration(end-clk.Now()))
	}

	clk.set(end - int64(2500*time.Millisecond)) // more than two intervals left: no renewal
	r = ask(t, s, e, "tb", key, 10, 0, 50)
	if clk.Now()+int64(r.ExpiresIn) != end {
		t.Fatalf("an ask 2.5 s before the end: held %d until +%v, want the first end (+%v)",
			r.Held, r.ExpiresIn, time.Duration(end-clk.Now()))
	}

	clk.add(time.Second) // 1.5 s before the end
	held := r.Held
	r = ask(t, s, e, "tb", key, 20, 0, 50)
	if r.Granted == 0 || r.Held != r.Granted || r.ExpiresIn != first.ExpiresIn {
		t.Fatalf("an ask 1.5 s before the end (%d held, 20 of them used): granted %d, held %d for %v; want a lease of its own for %v",
			held, r.Granted, r.Held, r.ExpiresIn, first.ExpiresIn)
	}
	// Sized as if nothing were held: 20 used in the last second is 25 units for
	// 5/4 of an interval, not 25 less the units given up.
	if r.Granted < 25 {
		t.Fatalf("the renewing grant is %d units, want at least 25 (the Envoy's demand, nothing held)", r.Granted)
	}
}
