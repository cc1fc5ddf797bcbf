// Package spans counts events in spans of time, for tests that hold an admission
// count to a bound over any interval (a token bucket's capacity plus its refill).
package spans

import (
	"slices"
	"time"
)

// MostWithin returns the most of the times at (Unix ns, in any order; at is
// sorted in place) that fall within any span of d: at[j] ≤ t < at[j]+d.
func MostWithin(at []int64, d time.Duration) int {
	slices.Sort(at)
	best, j := 0, 0
	for i := range at {
		for at[i]-at[j] >= int64(d) {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}
