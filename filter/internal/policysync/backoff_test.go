package policysync

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	lowest := func(int64) int64 { return 0 }
	highest := func(n int64) int64 { return n - 1 }
	for _, tc := range []struct {
		name string
		rnd  func(int64) int64
		want []time.Duration
	}{
		{"lowest jitter", lowest, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms}},
		{"highest jitter", highest, []time.Duration{100*ms - 1, 200*ms - 1, 400*ms - 1}},
	} {
		b := Backoff{Min: 100 * ms, Max: 30 * time.Second, Int64N: tc.rnd}
		for i, want := range tc.want {
			if got := b.Next(); got != want {
				t.Errorf("%s: wait %d = %v, want %v", tc.name, i+1, got, want)
			}
		}
	}
}

func TestBackoffCapAndReset(t *testing.T) {
	b := Backoff{Min: 100 * ms, Max: 30 * time.Second, Int64N: func(n int64) int64 { return n - 1 }}
	var last time.Duration
	for range 100 {
		last = b.Next()
		if last >= 30*time.Second || last < 0 {
			t.Fatalf("wait %v outside [0, Max)", last)
		}
	}
	if last < 15*time.Second {
		t.Errorf("wait after 100 failures = %v, want in [15s, 30s)", last)
	}
	if b.Failures() != 100 {
		t.Errorf("Failures() = %d, want 100", b.Failures())
	}
	b.Reset()
	if got := b.Next(); got != 100*ms-1 {
		t.Errorf("after Reset: %v, want %v", got, 100*ms-1)
	}
}

func TestBackoffDefaultJitterInRange(t *testing.T) {
	b := Backoff{Min: DefaultBackoffMin, Max: DefaultBackoffMax}
	for i := range 20 {
		d := b.Next()
		hi := min(DefaultBackoffMax, DefaultBackoffMin<<i)
		if d < hi/2 || d >= hi {
			t.Errorf("wait %d = %v, want in [%v, %v)", i+1, d, hi/2, hi)
		}
	}
}

const ms = time.Millisecond
