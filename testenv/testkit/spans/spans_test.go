package spans

import (
	"testing"
	"time"
)

// TestMostWithinCountsTheBusiestSpan: a span holds the times from its start up
// to, not including, its start plus d, whatever their order.
func TestMostWithinCountsTheBusiestSpan(t *testing.T) {
	s := int64(time.Second)
	for _, tc := range []struct {
		at   []int64
		d    time.Duration
		want int
	}{
		{nil, time.Second, 0},
		{[]int64{5 * s}, time.Second, 1},
		{[]int64{0, s, 2 * s}, time.Second, 1},
		{[]int64{2 * s, 0, s - 1, s}, time.Second, 2},
		{[]int64{0, 1, 2, 3, 10 * s, 10*s + 1}, time.Second, 4},
		{[]int64{0, 1, 2, 3, 10 * s, 10*s + 1}, 11 * time.Second, 6},
	} {
		if got := MostWithin(append([]int64(nil), tc.at...), tc.d); got != tc.want {
			t.Errorf("MostWithin(%v, %v) = %d, want %d", tc.at, tc.d, got, tc.want)
		}
	}
}
