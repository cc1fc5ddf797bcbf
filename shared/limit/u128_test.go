package limit

import (
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestDiv128MatchesLongDivision checks div128's 64-bit fast path (hi == 0)
// and its long division against bits.Div64, and its saturation.
func TestDiv128MatchesLongDivision(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 100000 {
		d := r.Uint64() >> (r.IntN(64))
		if d == 0 {
			d = 1
		}
		hi, lo := uint64(0), r.Uint64()>>(r.IntN(64))
		if i%2 == 1 {
			hi = r.Uint64() % d
		}
		q, rem := div128(hi, lo, d)
		wq, wr := bits.Div64(hi, lo, d)
		if q != wq || rem != wr {
			t.Fatalf("div128(%d, %d, %d) = %d, %d; want %d, %d", hi, lo, d, q, rem, wq, wr)
		}
	}
	if q, rem := div128(5, 0, 5); q != 1<<64-1 || rem != 0 {
		t.Errorf("div128 of a quotient beyond 64 bits = %d, %d; want saturation", q, rem)
	}
	if q, rem := div128(0, 7, 0); q != 1<<64-1 || rem != 0 {
		t.Errorf("div128 by 0 = %d, %d; want saturation", q, rem)
	}
}
