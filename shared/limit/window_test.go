package limit

import (
	"testing"
	"time"
)

func TestTimeWheel(t *testing.T) {
	ns := time.Nanosecond
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "10 slots of 1s, limit 100",
			cfg:  Config{Algorithm: TimeWheel, Limit: 100, Window: 10 * sec, Slots: 10},
			steps: []step{
				{500 * ms, 60, allow(100, 40, 9500*ms)},       // slot 0 leaves at 10s
				{3200 * ms, 40, allow(100, 0, 9800*ms)},       // slot 3 leaves at 13s
				{9900 * ms, 1, deny(100, 0, 3100*ms, 100*ms)}, // slot 0 (60) leaves at 10s
				{10 * sec, 1, allow(100, 59, 10*sec)},
				{10 * sec, 60, deny(100, 59, 10*sec, 3*sec)}, // needs slot 3 (40) gone: 13s
				{10 * sec, 59, allow(100, 0, 10*sec)},
				{13*sec - ns, 1, deny(100, 0, 7*sec+ns, ns)},
				{13 * sec, 1, allow(100, 39, 10*sec)},
				{13 * sec, 101, deny(100, 39, 10*sec, Never)},
				{13 * sec, 0, allow(100, 39, 10*sec)},
				{60 * sec, 100, allow(100, 0, 10*sec)},
			},
		},
		{
			name: "5 per 15s in 15 slots: 6th denied until the first slot leaves",
			cfg:  Config{Algorithm: TimeWheel, Limit: 5, Window: 15 * sec, Slots: 15},
			steps: []step{
				{0, 1, allow(5, 4, 15*sec)},
				{1 * sec, 1, allow(5, 3, 15*sec)},
				{2 * sec, 1, allow(5, 2, 15*sec)},
				{3 * sec, 1, allow(5, 1, 15*sec)},
				{4 * sec, 1, allow(5, 0, 15*sec)},
				{5 * sec, 1, deny(5, 0, 14*sec, 10*sec)},
				{15 * sec, 1, allow(5, 0, 15*sec)},
			},
		},
		{
			name: "default 10 slots; window 1s/3 slots is not whole ns: boundaries at ceil",
			cfg:  Config{Algorithm: TimeWheel, Limit: 1, Window: sec, Slots: 3},
			steps: []step{
				{0, 1, allow(1, 0, sec)},
				{333333333 * ns, 1, deny(1, 0, 666666667*ns, 666666667*ns)},
				{sec - ns, 1, deny(1, 0, ns, ns)},
				{sec, 1, allow(1, 0, sec)},
				// slot 4 starts at ceil(4/3 s) = 1333333334ns
				{1333333334 * ns, 1, deny(1, 0, 666666666*ns, 666666666*ns)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestFixedWindow(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "5 per 15s: 6th denied until the window ends",
			cfg:  Config{Algorithm: FixedWindow, Limit: 5, Window: 15 * sec},
			steps: []step{
				{0, 1, allow(5, 4, 15*sec)},
				{1 * sec, 1, allow(5, 3, 14*sec)},
				{2 * sec, 1, allow(5, 2, 13*sec)},
				{3 * sec, 1, allow(5, 1, 12*sec)},
				{4 * sec, 1, allow(5, 0, 11*sec)},
				{5 * sec, 1, deny(5, 0, 10*sec, 10*sec)},
				{15*sec - 1, 1, deny(5, 0, 1, 1)},
				{15 * sec, 1, allow(5, 4, 15*sec)},
				{15 * sec, 5, deny(5, 4, 15*sec, 15*sec)},
				{15 * sec, 6, deny(5, 4, 15*sec, Never)},
			},
		},
		{
			name: "3 per 5s admits 6 within 1.9s across a boundary",
			cfg:  Config{Algorithm: FixedWindow, Limit: 3, Window: 5 * sec},
			steps: []step{
				{4000 * ms, 1, allow(3, 2, 1000*ms)},
				{4500 * ms, 1, allow(3, 1, 500*ms)},
				{4900 * ms, 1, allow(3, 0, 100*ms)},
				{4950 * ms, 1, deny(3, 0, 50*ms, 50*ms)},
				{5000 * ms, 1, allow(3, 2, 5000*ms)},
				{5500 * ms, 1, allow(3, 1, 4500*ms)},
				{5900 * ms, 1, allow(3, 0, 4100*ms)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// TestBoundaryBurst is the seed scenario: 3 per 5s, requests at 4.0, 4.5, 4.9, 5.0,
// 5.5 s. fixed_window admits all 5 within 1.5 s; time_wheel, sliding_log and gcra
// admit 3.
func TestBoundaryBurst(t *testing.T) {
	times := []time.Duration{4000 * ms, 4500 * ms, 4900 * ms, 5000 * ms, 5500 * ms}
	tests := []struct {
		cfg  Config
		want int
	}{
		{Config{Algorithm: FixedWindow, Limit: 3, Window: 5 * sec}, 5},
		{Config{Algorithm: TimeWheel, Limit: 3, Window: 5 * sec, Slots: 5}, 3},
		{Config{Algorithm: TimeWheel, Limit: 3, Window: 5 * sec}, 3},
		{Config{Algorithm: SlidingLog, Limit: 3, Window: 5 * sec}, 3},
		{Config{Algorithm: GCRA, Limit: 3, Window: 5 * sec, Burst: 2}, 3},
		{Config{Algorithm: TokenBucket, Limit: 3, Window: 5 * sec}, 3},
	}
	for _, tt := range tests {
		l := mustNew(t, tt.cfg)
		state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
		got := 0
		for _, at := range times {
			if l.Decide(state, next, t0+int64(at), 1).Allowed {
				got++
				state, next = next, state
			}
		}
		if got != tt.want {
			t.Errorf("%v slots=%d: admitted %d of 5 within 1.5s, want %d", tt.cfg.Algorithm, tt.cfg.Slots, got, tt.want)
		}
	}
}

func TestFixedWindowCalendarDay(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	sp, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		t.Skip(err)
	}
	tests := []struct {
		name    string
		loc     *time.Location
		now     time.Time
		wantEnd time.Time
	}{
		{"UTC", nil, time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC), time.Date(2025, 6, 2, 0, 0, 0, 0, time.UTC)},
		{"23h day (spring forward)", ny, time.Date(2025, 3, 9, 0, 30, 0, 0, ny), time.Date(2025, 3, 10, 0, 0, 0, 0, ny)},
		{"25h day (fall back)", ny, time.Date(2025, 11, 2, 0, 30, 0, 0, ny), time.Date(2025, 11, 3, 0, 0, 0, 0, ny)},
		{"last instant of a day", ny, time.Date(2025, 11, 2, 23, 59, 59, 999999999, ny), time.Date(2025, 11, 3, 0, 0, 0, 0, ny)},
		// Sao Paulo skipped midnight on 2018-11-04 (00:00 -03 became 01:00 -02).
		{"skipped midnight", sp, time.Date(2018, 11, 3, 23, 30, 0, 0, sp), time.Date(2018, 11, 4, 3, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{Algorithm: FixedWindow, Limit: 2, CalendarDay: true, Location: tt.loc})
			st, nx := make([]byte, l.StateSize()), make([]byte, l.StateSize())
			now := tt.now.UnixNano()
			d := l.Decide(st, nx, now, 2)
			want := tt.wantEnd.Sub(tt.now)
			if !d.Allowed || d.Reset != want {
				t.Fatalf("first: %+v, want allowed with Reset %v", d, want)
			}
			st, nx = nx, st
			if d := l.Decide(st, nx, now, 1); d.Allowed || d.RetryAfter != want {
				t.Fatalf("second: %+v, want denied, RetryAfter %v", d, want)
			}
			if d := l.Decide(st, nx, tt.wantEnd.UnixNano(), 1); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("next day: %+v", d)
			}
		})
	}
	if got := mustNew(t, Config{Algorithm: FixedWindow, Limit: 1, CalendarDay: true}).Config(); got.Window != 24*time.Hour || got.Location != time.UTC {
		t.Errorf("calendar defaults: %+v", got)
	}
}

func TestSlidingLog(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "5 per 15s: 6th denied until the first leaves the window",
			cfg:  Config{Algorithm: SlidingLog, Limit: 5, Window: 15 * sec},
			steps: []step{
				{0, 1, allow(5, 4, 15*sec)},
				{1 * sec, 1, allow(5, 3, 15*sec)},
				{2 * sec, 1, allow(5, 2, 15*sec)},
				{3 * sec, 1, allow(5, 1, 15*sec)},
				{4 * sec, 1, allow(5, 0, 15*sec)},
				{5 * sec, 1, deny(5, 0, 14*sec, 10*sec)},
				{15*sec - 1, 1, deny(5, 0, 4*sec+1, 1)},
				{15 * sec, 1, allow(5, 0, 15*sec)},
				{15 * sec, 1, deny(5, 0, 15*sec, 1*sec)},
				{17 * sec, 2, allow(5, 0, 15*sec)}, // 1 and 2 left at 16 and 17 s
				{17 * sec, 6, deny(5, 0, 15*sec, Never)},
				{17 * sec, 0, allow(5, 0, 15*sec)},
				{40 * sec, 5, allow(5, 0, 15*sec)},
			},
		},
		{
			name: "cost 3 of 4 waits for the 3rd oldest",
			cfg:  Config{Algorithm: SlidingLog, Limit: 4, Window: 10 * sec},
			steps: []step{
				{0, 2, allow(4, 2, 10*sec)},
				{1 * sec, 1, allow(4, 1, 10*sec)},
				{2 * sec, 3, deny(4, 1, 9*sec, 8*sec)}, // needs 2 of {0,0,1}: 0 and 0 leave at 10s
				{10 * sec, 3, allow(4, 0, 10*sec)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestConcurrency(t *testing.T) {
	l := mustNew(t, Config{Algorithm: Concurrency, Limit: 2, Lease: 10 * sec})
	st, nx := make([]byte, l.StateSize()), make([]byte, l.StateSize())
	at := func(d time.Duration) int64 { return t0 + int64(d) }
	decide := func(now time.Duration, cost uint64, want Decision) {
		t.Helper()
		got := l.Decide(st, nx, at(now), cost)
		if got != want {
			t.Fatalf("at %v cost %d: got %+v, want %+v", now, cost, got, want)
		}
		if got.Allowed {
			st, nx = nx, st
		}
	}
	release := func(now, acquired time.Duration, cost uint64) {
		t.Helper()
		if !l.Release(st, nx, at(now), at(acquired), cost) {
			t.Fatal("Release unsupported")
		}
		st, nx = nx, st
	}
	decide(0, 1, allow(2, 1, 10*sec))
	decide(1*sec, 1, allow(2, 0, 10*sec))
	decide(2*sec, 1, deny(2, 0, 9*sec, 8*sec)) // the 0s lease ends at 10s
	release(3*sec, 7*sec, 1)                   // not ours: nothing freed
	decide(3*sec, 1, deny(2, 0, 8*sec, 7*sec))
	release(3*sec, 0, 1)
	decide(3*sec, 1, allow(2, 0, 10*sec))
	decide(3*sec, 3, deny(2, 0, 10*sec, Never))
	decide(3*sec, 2, deny(2, 0, 10*sec, 10*sec)) // both leases must end: 11s and 13s
	// The 1s request never releases: its lease ends at 11s.
	decide(11*sec, 1, allow(2, 0, 10*sec))
	release(12*sec, 1*sec, 1) // late release of a reclaimed lease: frees nothing
	decide(12*sec, 1, deny(2, 0, 9*sec, 1*sec))
	if l.Idle(st, at(20*sec)) || !l.Idle(st, at(21*sec)) || l.IdleAt(st, at(12*sec)) != at(21*sec) {
		t.Fatalf("Idle/IdleAt wrong: IdleAt=%v", time.Duration(l.IdleAt(st, at(12*sec))-t0))
	}
	if l.Adjust(st, nx, at(12*sec), 1) {
		t.Fatal("Adjust should be unsupported")
	}
}
