package limit

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// A bucket whose values fit in 64 bits decides in 64-bit arithmetic; it must
// give the decision and the state the 128-bit arithmetic gives, for fresh, garbage
// and believable states, clamped ones among them, and every cost.
func TestANarrowBucketDecidesAsTheWideArithmeticDoes(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 1))
	now := t0
	var narrow, compared int
	for _, alg := range []Algorithm{TokenBucket, GCRA} {
		for _, lim := range []uint64{1, 3, 7, 1000, 1_000_000, 100_000_000} {
			for _, w := range []time.Duration{time.Millisecond, time.Second, 7 * time.Second, time.Minute, time.Hour, 24 * time.Hour} {
				for _, burst := range []uint64{0, 1, 2, 3 * lim} {
					if alg == GCRA && burst == 0 {
						continue
					}
					l, err := New(Config{Algorithm: alg, Limit: lim, Window: w, Burst: burst})
					if err != nil {
						continue // a refill longer than MaxRefill
					}
					tt := l.(*tat)
					if !tt.narrow {
						continue
					}
					narrow++
					wide := *tt
					wide.narrow = false
					for i := 0; i < 300; i++ {
						state := narrowTestState(rng, tt, now)
						cost := []uint64{0, 1, 2, tt.capacity, tt.capacity + 1, rng.Uint64N(tt.capacity + 1)}[rng.IntN(6)]
						n1, n2 := make([]byte, tatSize), make([]byte, tatSize)
						d1 := tt.Decide(state, n1, now, cost)
						d2 := wide.Decide(state, n2, now, cost)
						if d1 != d2 || !bytes.Equal(n1, n2) {
							t.Fatalf("%v %d per %v burst %d, state %x, cost %d:\n narrow %+v %x\n wide   %+v %x",
								alg, lim, w, burst, state, cost, d1, n1, d2, n2)
						}
						compared++
					}
				}
			}
		}
	}
	if narrow < 100 {
		t.Fatalf("only %d narrow buckets compared", narrow)
	}
	t.Logf("%d narrow buckets, %d decisions compared", narrow, compared)
}

// narrowTestState returns a state for tt at now: none, garbage, or a TAT
// from before now to beyond the furthest believable, with a fraction
// sometimes past the limit.
func narrowTestState(rng *rand.Rand, tt *tat, now int64) []byte {
	switch rng.IntN(8) {
	case 0:
		return nil
	case 1:
		b := make([]byte, tatSize)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	b := make([]byte, tatSize)
	ahead := int64(rng.Uint64N(tt.maxAhead + 3))
	if rng.IntN(4) == 0 {
		ahead = -int64(rng.Uint64N(uint64(time.Hour)))
	}
	frac := rng.Uint64N(tt.limit)
	if rng.IntN(10) == 0 {
		frac = tt.limit + rng.Uint64N(3)
	}
	st64(b, tatAt, uint64(now+ahead))
	st64(b, tatFrac, frac)
	return b
}

// Buckets too large for 64 bits keep the 128-bit arithmetic.
func TestABucketPast64BitsIsNotNarrow(t *testing.T) {
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 1_000_000_000, Window: time.Minute},
		{Algorithm: TokenBucket, Limit: 1 << 40, Window: time.Hour},
		{Algorithm: TokenBucket, Limit: 1_000_000, Window: 24 * time.Hour},
	} {
		if mustNew(t, c).(*tat).narrow {
			t.Errorf("%+v: narrow, its C·W does not fit in 64 bits", c)
		}
	}
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 100_000_000, Window: time.Minute},
		{Algorithm: TokenBucket, Limit: 1_700_000, Window: time.Hour},
		{Algorithm: TokenBucket, Limit: 71_000, Window: 24 * time.Hour},
	} {
		if !mustNew(t, c).(*tat).narrow {
			t.Errorf("%+v: not narrow, its values fit in 64 bits", c)
		}
	}
}
