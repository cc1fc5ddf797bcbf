package limit

import (
	"errors"
	"testing"
	"time"
)

func TestParseAlgorithm(t *testing.T) {
	for a := TokenBucket; a <= Concurrency; a++ {
		got, ok := ParseAlgorithm(a.String())
		if !ok || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, ok)
		}
	}
	for _, name := range []string{"", "Token_Bucket", "leaky_bucket", "algorithm(1)"} {
		if _, ok := ParseAlgorithm(name); ok {
			t.Errorf("ParseAlgorithm(%q) accepted", name)
		}
	}
	if got := Algorithm(0).String(); got != "algorithm(0)" {
		t.Errorf("Algorithm(0).String() = %q", got)
	}
	want := []string{"token_bucket", "time_wheel", "fixed_window", "gcra", "sliding_log", "concurrency"}
	for i, w := range want {
		if got := Algorithm(i + 1).String(); got != w {
			t.Errorf("Algorithm(%d) = %q, want %q", i+1, got, w)
		}
	}
}

func TestValidateOK(t *testing.T) {
	ny := time.FixedZone("X", 3600)
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 1, Window: MinWindow},
		{Algorithm: TokenBucket, Limit: MaxLimit, Window: MaxWindow},
		{Algorithm: TokenBucket, Limit: 10, Window: sec, Burst: 1},
		{Algorithm: GCRA, Limit: 1, Window: sec, Burst: 1000},
		{Algorithm: TimeWheel, Limit: MaxWheelLimit, Window: time.Minute, Slots: MaxSlots},
		{Algorithm: TimeWheel, Limit: 1, Window: time.Minute, Slots: 1},
		{Algorithm: FixedWindow, Limit: 5, Window: 15 * sec},
		{Algorithm: FixedWindow, Limit: 5, CalendarDay: true},
		{Algorithm: FixedWindow, Limit: 5, CalendarDay: true, Window: 24 * time.Hour, Location: ny},
		{Algorithm: SlidingLog, Limit: MaxSlidingLogLimit, Window: time.Hour},
		{Algorithm: Concurrency, Limit: MaxConcurrencyLimit},
		{Algorithm: Concurrency, Limit: 1, Lease: MaxLease},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", c, err)
		}
	}
}

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no algorithm", Config{Limit: 1, Window: sec}, "algorithm: unknown algorithm 0"},
		{"zero limit", Config{Algorithm: TokenBucket, Window: sec}, "limit: must be > 0"},
		{"limit too big", Config{Algorithm: FixedWindow, Limit: MaxLimit + 1, Window: sec}, "limit: must be <= 1099511627776 for fixed_window, got 1099511627777"},
		{"wheel limit", Config{Algorithm: TimeWheel, Limit: 1 << 32, Window: sec}, "limit: must be <= 4294967295 for time_wheel, got 4294967296"},
		{"log limit", Config{Algorithm: SlidingLog, Limit: 65, Window: sec}, "limit: must be <= 64 for sliding_log, got 65"},
		{"concurrency limit", Config{Algorithm: Concurrency, Limit: 200}, "limit: must be <= 64 for concurrency, got 200"},
		{"zero window", Config{Algorithm: GCRA, Limit: 1}, "window: must be > 0"},
		{"negative window", Config{Algorithm: GCRA, Limit: 1, Window: -sec}, "window: must be > 0"},
		{"short window", Config{Algorithm: SlidingLog, Limit: 1, Window: time.Microsecond}, "window: must be >= 1ms, got 1µs"},
		{"long window", Config{Algorithm: FixedWindow, Limit: 1, Window: 367 * 24 * time.Hour}, "window: must be <= 8784h0m0s, got 8808h0m0s"},
		{"window on concurrency", Config{Algorithm: Concurrency, Limit: 1, Window: sec}, "window: not used by concurrency, must be omitted"},
		{"calendar window", Config{Algorithm: FixedWindow, Limit: 1, Window: time.Hour, CalendarDay: true}, "window: must be 24h or omitted with calendar_day, got 1h0m0s"},
		{"burst too big", Config{Algorithm: TokenBucket, Limit: 1, Window: sec, Burst: MaxLimit + 1}, "burst: must be <= 1099511627776, got 1099511627777"},
		{"refill too long", Config{Algorithm: GCRA, Limit: 1, Window: MaxWindow, Burst: 10}, "burst: refill time of the whole bucket (capacity*window/limit) must be <= 87840h0m0s"},
		{"burst on window", Config{Algorithm: FixedWindow, Limit: 1, Window: sec, Burst: 2}, "burst: not used by fixed_window, must be omitted"},
		{"too many slots", Config{Algorithm: TimeWheel, Limit: 1, Window: sec, Slots: 61}, "slots: must be <= 60, got 61"},
		{"slots elsewhere", Config{Algorithm: SlidingLog, Limit: 1, Window: sec, Slots: 10}, "slots: not used by sliding_log, must be omitted"},
		{"calendar elsewhere", Config{Algorithm: TimeWheel, Limit: 1, Window: sec, CalendarDay: true}, "calendar_day: only for fixed_window"},
		{"timezone without calendar", Config{Algorithm: FixedWindow, Limit: 1, Window: sec, Location: time.UTC}, "timezone: only with calendar_day"},
		{"negative lease", Config{Algorithm: Concurrency, Limit: 1, Lease: -1}, "lease: must be > 0"},
		{"short lease", Config{Algorithm: Concurrency, Limit: 1, Lease: time.Microsecond}, "lease: must be >= 1ms, got 1µs"},
		{"long lease", Config{Algorithm: Concurrency, Limit: 1, Lease: 25 * time.Hour}, "lease: must be <= 24h0m0s, got 25h0m0s"},
		{"lease elsewhere", Config{Algorithm: TokenBucket, Limit: 1, Window: sec, Lease: sec}, "lease: not used by token_bucket, must be omitted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate() = %v, want %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("errors.Is(err, ErrInvalidConfig) = false")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Param+": "+ce.Reason != tt.want {
				t.Errorf("not a *ConfigError: %#v", err)
			}
			if l, err2 := New(tt.cfg); l != nil || err2 == nil || err2.Error() != tt.want {
				t.Errorf("New() = %v, %v", l, err2)
			}
		})
	}
}

func TestDefaultsAndFingerprint(t *testing.T) {
	tb := mustNew(t, Config{Algorithm: TokenBucket, Limit: 7, Window: sec})
	if tb.Config().Burst != 7 {
		t.Errorf("token_bucket Burst default = %d", tb.Config().Burst)
	}
	if got := mustNew(t, Config{Algorithm: TimeWheel, Limit: 7, Window: sec}); got.Config().Slots != DefaultSlots || got.StateSize() != 8+4*int(DefaultSlots) {
		t.Errorf("time_wheel defaults: %+v size %d", got.Config(), got.StateSize())
	}
	if got := mustNew(t, Config{Algorithm: Concurrency, Limit: 7}); got.Config().Lease != DefaultLease || got.StateSize() != 56 {
		t.Errorf("concurrency defaults: %+v size %d", got.Config(), got.StateSize())
	}
	// Equivalent definitions share state; any change of a parameter does not.
	same := mustNew(t, Config{Algorithm: TokenBucket, Limit: 7, Window: sec, Burst: 7})
	if same.Fingerprint() != tb.Fingerprint() {
		t.Error("explicit default Burst changed the fingerprint")
	}
	seen := map[uint32]Config{}
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 7, Window: sec},
		{Algorithm: GCRA, Limit: 7, Window: sec, Burst: 6},
		{Algorithm: TokenBucket, Limit: 8, Window: sec},
		{Algorithm: TokenBucket, Limit: 7, Window: 2 * sec},
		{Algorithm: TokenBucket, Limit: 7, Window: sec, Burst: 8},
		{Algorithm: FixedWindow, Limit: 7, Window: sec},
		{Algorithm: FixedWindow, Limit: 7, CalendarDay: true},
		{Algorithm: FixedWindow, Limit: 7, CalendarDay: true, Location: time.FixedZone("A", 3600)},
		{Algorithm: TimeWheel, Limit: 7, Window: sec, Slots: 5},
		{Algorithm: Concurrency, Limit: 7, Lease: sec},
	} {
		fp := mustNew(t, c).Fingerprint()
		if prev, dup := seen[fp]; dup {
			t.Errorf("fingerprint collision: %+v and %+v", prev, c)
		}
		seen[fp] = c
	}
}
