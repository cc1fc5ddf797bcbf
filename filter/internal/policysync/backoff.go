package policysync

import (
	"math/rand/v2"
	"time"
)

// Backoff bounds the wait before retrying a failed poll: the n-th
// consecutive failure (n from 1) waits a random duration in [d/2, d) where
// d = min(Max, Min × 2^(n-1)) ("equal jitter"), so retries from many Envoys
// spread out while the wait still grows.
type Backoff struct {
	// Min is the ceiling of the first wait; Max caps every wait.
	Min, Max time.Duration
	// Int64N returns a uniform value in [0, n); nil means
	// math/rand/v2.Int64N. Tests inject a fixed one.
	Int64N func(n int64) int64

	failures int
}

// DefaultBackoffMin and DefaultBackoffMax are the bounds the Syncer uses:
// 100 ms to 30 s.
const (
	DefaultBackoffMin = 100 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// Next records a failure and returns how long to wait before the next
// attempt.
func (b *Backoff) Next() time.Duration {
	b.failures++
	d := b.Min
	for i := 1; i < b.failures && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d <= 1 {
		return d
	}
	half := int64(d / 2)
	rnd := b.Int64N
	if rnd == nil {
		rnd = rand.Int64N
	}
	return time.Duration(half + rnd(int64(d)-half))
}

// Failures returns the number of failures since the last Reset.
func (b *Backoff) Failures() int { return b.failures }

// Reset forgets the failures after a success.
func (b *Backoff) Reset() { b.failures = 0 }
