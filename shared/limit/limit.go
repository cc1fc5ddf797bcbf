// Package limit holds sluice's exact rate-limit algorithms over fixed-size binary state.
//
// Every algorithm is a Limiter built from a validated Config. A Limiter keeps no
// per-key state of its own: the caller reads a key's state bytes (from proxy-wasm
// shared data), calls Decide, and, if it decides to commit, stores the bytes Decide
// wrote into next (with a compare-and-swap). Decide is a pure function of
// (state, now, cost): it never mutates state, never allocates, never panics on any
// bytes, and does no I/O; time is always an argument (Unix nanoseconds). This is what
// lets the filter check every matching rule first and consume from all of them only
// when all allow (docs/ARCHITECTURE.md, The request path).
//
// State bytes come from a shared store another plugin could scribble on, so every
// decoder accepts any bytes: a state that is implausible for `now` (a time far in the
// future, beyond what the algorithm can ever produce) is treated as a fresh key. A
// small backward step of the clock (another worker wrote a slightly later `now`) is
// tolerated and never admits more than the bound.
//
// Failure policy: a bad Config is rejected by Validate/New with an error naming the
// parameter (by its JSON name); nothing here fails while serving.
//
// # Algorithms at a glance
//
//	algorithm     state bytes     cost of a decision  Adjust  Release  bound
//	token_bucket  16              O(1)                yes     -        Burst + Limit·t/Window in any t
//	gcra          16              O(1)                yes     -        Burst+1 + Limit·t/Window in any t
//	time_wheel    8 + 4·Slots     O(Slots)            yes     -        Limit in any Slots consecutive slots
//	fixed_window  16              O(1)                yes     -        Limit per aligned window (2·Limit across a boundary)
//	sliding_log   8 + 8·Limit     O(Limit)            -       -        Limit in any interval of Window
//	concurrency   8·Limit         O(Limit)            -       yes      Limit held (acquired, not released, lease not over)
//
// Each algorithm's file documents its parameters, its Decision fields and its state
// layout. Subpackages: siphash (the keyed hash of client keys) and table (the bucket
// of entries stored under one shared-data key).
package limit

import (
	"errors"
	"strconv"
	"time"
)

// Algorithm names a limit algorithm; its String() is the JSON name.
type Algorithm uint8

// The algorithms. Their values are stored in bucket headers, so they never change.
const (
	TokenBucket Algorithm = iota + 1 // "token_bucket"
	TimeWheel                        // "time_wheel"
	FixedWindow                      // "fixed_window"
	GCRA                             // "gcra"
	SlidingLog                       // "sliding_log"
	Concurrency                      // "concurrency"
)

var algorithmNames = [...]string{
	TokenBucket: "token_bucket",
	TimeWheel:   "time_wheel",
	FixedWindow: "fixed_window",
	GCRA:        "gcra",
	SlidingLog:  "sliding_log",
	Concurrency: "concurrency",
}

// ParseAlgorithm returns the Algorithm whose JSON name is name ("token_bucket", ...),
// and false for any other string (names are case-sensitive).
func ParseAlgorithm(name string) (Algorithm, bool) {
	for a := TokenBucket; a <= Concurrency; a++ {
		if algorithmNames[a] == name {
			return a, true
		}
	}
	return 0, false
}

// String returns the JSON name of a, or "algorithm(N)" for an unknown value.
func (a Algorithm) String() string {
	if a >= TokenBucket && a <= Concurrency {
		return algorithmNames[a]
	}
	return "algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Bounds on Config, exported so rule validation can cite them. They keep every
// algorithm's arithmetic exact in 128-bit integers and every state small.
const (
	// MaxLimit is the largest Limit and Burst (cost units): 2^40 ≈ 1.1e12.
	MaxLimit uint64 = 1 << 40
	// MaxWheelLimit is the largest Limit of a time_wheel (its slot counters are 32-bit).
	MaxWheelLimit uint64 = 1<<32 - 1
	// MaxSlidingLogLimit is the largest Limit of a sliding_log, whose state keeps one
	// 8-byte timestamp per admitted unit (state 8+8·Limit bytes, copied and checked on
	// every decision: about 1.3 ns per unit, so ~100 ns at this bound).
	MaxSlidingLogLimit uint64 = 64
	// MaxConcurrencyLimit is the largest Limit of a concurrency limiter, whose state keeps
	// one 8-byte lease expiry per slot (state 8·Limit bytes, scanned on every decision).
	MaxConcurrencyLimit uint64 = 64
	// MinWindow is the shortest Window.
	MinWindow = time.Millisecond
	// MaxWindow is the longest Window: 366 days.
	MaxWindow = 366 * 24 * time.Hour
	// MaxRefill bounds the time an empty token_bucket or gcra takes to refill completely
	// (capacity·Window/Limit): 10 years.
	MaxRefill = 10 * 366 * 24 * time.Hour
	// DefaultSlots is the number of time_wheel slots when Slots is 0.
	DefaultSlots uint32 = 10
	// MaxSlots is the largest number of time_wheel slots (state 8+4·Slots bytes).
	MaxSlots uint32 = 60
	// DefaultLease is the concurrency lease when Lease is 0.
	DefaultLease = 5 * time.Minute
	// MinLease is the shortest concurrency lease.
	MinLease = time.Millisecond
	// MaxLease is the longest concurrency lease.
	MaxLease = 24 * time.Hour
	// CalendarDayWindow is the nominal Window of a calendar-day fixed_window (the real
	// day is 23 or 25 hours on a DST change).
	CalendarDayWindow = 24 * time.Hour
)

// Never is Decision.RetryAfter when no wait can make the request admissible (its cost
// exceeds the limiter's capacity).
const Never = time.Duration(1<<63 - 1)

// Config is one rule's algorithm and parameters; the JSON name of each is in brackets.
// Parameters an algorithm does not use must be zero (Validate rejects them).
type Config struct {
	// Algorithm ["algorithm"] selects the algorithm.
	Algorithm Algorithm
	// Limit ["limit"]: cost units admitted per Window (the rate numerator); for
	// Concurrency the number of cost units (requests) in flight. 1..MaxLimit, and at most
	// MaxWheelLimit, MaxSlidingLogLimit, MaxConcurrencyLimit for those algorithms.
	Limit uint64
	// Window ["window"]: the period of Limit, MinWindow..MaxWindow. Unused by Concurrency.
	// With CalendarDay it must be 0 or 24h (the window is the local calendar day).
	Window time.Duration
	// Burst ["burst"]: TokenBucket: the bucket capacity in cost units (0 = Limit).
	// GCRA: extra requests beyond the steady rate admitted at once, as nginx limit_req
	// burst (0 = none, so one request per Window/Limit). Unused by the others.
	Burst uint64
	// Slots ["slots"]: TimeWheel: the slots the window is split into, 1..MaxSlots
	// (0 = DefaultSlots). Unused by the others.
	Slots uint32
	// CalendarDay ["calendar_day"]: FixedWindow only: windows are local calendar days
	// in Location, ending at local midnight (23 or 25 hours long on DST changes).
	CalendarDay bool
	// Location ["timezone"]: FixedWindow with CalendarDay: the time zone of the calendar
	// (nil = UTC). Must be nil otherwise.
	Location *time.Location
	// Lease ["lease"]: Concurrency: a slot not released this long after it was acquired
	// is reclaimed. MinLease..MaxLease (0 = DefaultLease). Unused by the others.
	Lease time.Duration
}

// ConfigError is the error Validate and New return: Param is the JSON name of the
// offending parameter ("limit", "window", "burst", "slots", "calendar_day",
// "timezone", "lease", "algorithm") and Reason says what is wrong, with the bound.
// Error() is "param: reason", e.g. "window: must be > 0".
type ConfigError struct {
	Param  string
	Reason string
}

// Error returns "param: reason".
func (e *ConfigError) Error() string { return e.Param + ": " + e.Reason }

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = errors.New("limit: invalid config")

// Is reports whether target is ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

func cfgErr(param, reason string) error { return &ConfigError{Param: param, Reason: reason} }

// Validate checks c against the bounds above and returns a *ConfigError naming the
// first bad parameter, in the order algorithm, limit, window, burst, slots,
// calendar_day, timezone, lease; nil if c is valid.
func (c Config) Validate() error {
	if c.Algorithm < TokenBucket || c.Algorithm > Concurrency {
		return cfgErr("algorithm", "unknown algorithm "+strconv.Itoa(int(c.Algorithm)))
	}
	name := c.Algorithm.String()
	// limit
	maxLimit := MaxLimit
	switch c.Algorithm {
	case TimeWheel:
		maxLimit = MaxWheelLimit
	case SlidingLog:
		maxLimit = MaxSlidingLogLimit
	case Concurrency:
		maxLimit = MaxConcurrencyLimit
	}
	if c.Limit == 0 {
		return cfgErr("limit", "must be > 0")
	}
	if c.Limit > maxLimit {
		return cfgErr("limit", "must be <= "+strconv.FormatUint(maxLimit, 10)+" for "+name+", got "+strconv.FormatUint(c.Limit, 10))
	}
	// window
	switch {
	case c.Algorithm == Concurrency:
		if c.Window != 0 {
			return cfgErr("window", "not used by concurrency, must be omitted")
		}
	case c.CalendarDay && c.Algorithm == FixedWindow:
		if c.Window != 0 && c.Window != CalendarDayWindow {
			return cfgErr("window", "must be 24h or omitted with calendar_day, got "+c.Window.String())
		}
	case c.Window <= 0:
		return cfgErr("window", "must be > 0")
	case c.Window < MinWindow:
		return cfgErr("window", "must be >= "+MinWindow.String()+", got "+c.Window.String())
	case c.Window > MaxWindow:
		return cfgErr("window", "must be <= "+MaxWindow.String()+", got "+c.Window.String())
	}
	// burst
	switch c.Algorithm {
	case TokenBucket, GCRA:
		if c.Burst > MaxLimit {
			return cfgErr("burst", "must be <= "+strconv.FormatUint(MaxLimit, 10)+", got "+strconv.FormatUint(c.Burst, 10))
		}
		if refillTooLong(c.capacity(), c.Window, c.Limit) {
			return cfgErr("burst", "refill time of the whole bucket (capacity*window/limit) must be <= "+MaxRefill.String())
		}
	default:
		if c.Burst != 0 {
			return cfgErr("burst", "not used by "+name+", must be omitted")
		}
	}
	// slots
	if c.Algorithm == TimeWheel {
		if c.Slots > MaxSlots {
			return cfgErr("slots", "must be <= "+strconv.Itoa(int(MaxSlots))+", got "+strconv.Itoa(int(c.Slots)))
		}
	} else if c.Slots != 0 {
		return cfgErr("slots", "not used by "+name+", must be omitted")
	}
	// calendar_day, timezone
	if c.CalendarDay && c.Algorithm != FixedWindow {
		return cfgErr("calendar_day", "only for fixed_window")
	}
	if c.Location != nil && !c.CalendarDay {
		return cfgErr("timezone", "only with calendar_day")
	}
	// lease
	if c.Algorithm == Concurrency {
		switch {
		case c.Lease < 0:
			return cfgErr("lease", "must be > 0")
		case c.Lease != 0 && c.Lease < MinLease:
			return cfgErr("lease", "must be >= "+MinLease.String()+", got "+c.Lease.String())
		case c.Lease > MaxLease:
			return cfgErr("lease", "must be <= "+MaxLease.String()+", got "+c.Lease.String())
		}
	} else if c.Lease != 0 {
		return cfgErr("lease", "not used by "+name+", must be omitted")
	}
	return nil
}

// withDefaults fills the zero defaults of a valid Config: token_bucket Burst = Limit,
// time_wheel Slots = DefaultSlots, calendar-day Window = 24h and Location = UTC,
// concurrency Lease = DefaultLease.
func (c Config) withDefaults() Config {
	switch c.Algorithm {
	case TokenBucket:
		if c.Burst == 0 {
			c.Burst = c.Limit
		}
	case TimeWheel:
		if c.Slots == 0 {
			c.Slots = DefaultSlots
		}
	case FixedWindow:
		if c.CalendarDay {
			c.Window = CalendarDayWindow
			if c.Location == nil {
				c.Location = time.UTC
			}
		}
	case Concurrency:
		if c.Lease == 0 {
			c.Lease = DefaultLease
		}
	}
	return c
}

// Capacity returns the bucket size in cost units of a TokenBucket (Burst, default
// Limit) or a GCRA (Burst+1, see tat.go), the most one request may cost; 0 for the
// other algorithms.
func (c Config) Capacity() uint64 { return c.capacity() }

// capacity is the bucket size in cost units of a TokenBucket (Burst, default Limit)
// or a GCRA (Burst+1, see gcra.go); 0 for the others.
func (c Config) capacity() uint64 {
	switch c.Algorithm {
	case TokenBucket:
		if c.Burst == 0 {
			return c.Limit
		}
		return c.Burst
	case GCRA:
		return c.Burst + 1
	}
	return 0
}

// refillTooLong reports whether capacity·window/limit > MaxRefill, in exact 128-bit
// arithmetic (window > 0, limit > 0).
func refillTooLong(capacity uint64, window time.Duration, limit uint64) bool {
	if window <= 0 || limit == 0 {
		return false
	}
	hi, lo := mul64(capacity, uint64(window))
	// capacity·window > MaxRefill·limit ?
	mhi, mlo := mul64(uint64(MaxRefill), limit)
	return cmp128(hi, lo, mhi, mlo) > 0
}

// Decision is the outcome of one Decide, with what the filter reports to the client.
type Decision struct {
	// Allowed reports whether the request is admitted; if so the caller commits next.
	Allowed bool
	// Limit is the quota to report (X-RateLimit-Limit), in cost units: Config.Limit for
	// the window algorithms and concurrency, the bucket capacity for token_bucket and
	// gcra (see each algorithm).
	Limit uint64
	// Remaining is the cost units still admissible right now after this request (if
	// allowed) or without it (if denied) (X-RateLimit-Remaining); exact per algorithm.
	Remaining uint64
	// Reset is the time from now until the key is back to its fresh state if nothing
	// else is admitted (X-RateLimit-Reset); for fixed_window the end of the window.
	Reset time.Duration
	// RetryAfter, when denied, is the earliest wait after which the same request would be
	// allowed if nothing else happened (Retry-After), or Never if it never can be; 0 when
	// allowed. For concurrency it is the time until enough leases expire (a release
	// may free a slot sooner).
	RetryAfter time.Duration
}

// Limiter is one rule's algorithm, bound to its Config. Its methods are safe for
// concurrent use (a Limiter is immutable); all state lives in the caller's bytes.
//
// Every method takes state (the stored bytes of one key; len StateSize; all zero is a
// fresh key; any other length or content is accepted and treated as fresh where it
// cannot be decoded) and writes the state to commit into next (len >= StateSize; only
// next[:StateSize] is written). state and next must not overlap. now is Unix
// nanoseconds; values below 0 are treated as 0 and values above MaxTime as MaxTime.
// None of them allocates or panics (a next shorter than StateSize is the one
// exception: it panics, as a programming error).
type Limiter interface {
	// Config returns the validated Config with defaults filled in.
	Config() Config
	// StateSize is the fixed size in bytes of one key's state.
	StateSize() int
	// Fingerprint identifies the algorithm and every parameter that shapes the state;
	// tables store it so state written under another definition is not misread.
	Fingerprint() uint32
	// Decide evaluates a request of cost units (cost 0 is a probe: allowed unless the
	// limit is already exceeded, consumes nothing) at now against state and writes into
	// next the state to store if the caller commits. If not allowed, next is a copy of
	// the (normalised) state, so committing it is harmless.
	Decide(state, next []byte, now int64, cost uint64) Decision
	// Adjust corrects the cost of an earlier admitted request by delta cost units
	// (positive charges more, negative refunds) and writes the new state to next. It
	// returns false, leaving next a copy of state, for the algorithms that do not
	// support it (sliding_log, concurrency). See each algorithm for the exact effect.
	Adjust(state, next []byte, now int64, delta int64) bool
	// Release frees cost slots acquired by a Decide at acquiredAt (the now given to that
	// Decide), for concurrency; a release whose lease has already been reclaimed is a
	// no-op. It returns false for every other algorithm (next = copy of state).
	Release(state, next []byte, now, acquiredAt int64, cost uint64) bool
	// Idle reports whether state is equivalent to a fresh key at now and at every later
	// time if nothing else is committed (so a table may reuse its entry).
	Idle(state []byte, now int64) bool
	// IdleAt returns the earliest time (Unix nanoseconds, >= now) from which state is
	// equivalent to a fresh key if nothing else is committed; now if it already is.
	// Tables store it beside the state so finding a reusable entry needs no decoding.
	IdleAt(state []byte, now int64) int64
}

// New validates c and returns its Limiter, or the *ConfigError of Validate.
func New(c Config) (Limiter, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	switch c.Algorithm {
	case TokenBucket, GCRA:
		return newTAT(c), nil
	case TimeWheel:
		return newTimeWheel(c), nil
	case FixedWindow:
		return newFixedWindow(c), nil
	case SlidingLog:
		return newSlidingLog(c), nil
	case Concurrency:
		return newConcurrency(c), nil
	}
	return nil, cfgErr("algorithm", "unknown algorithm "+strconv.Itoa(int(c.Algorithm)))
}
