package limit

import (
	"encoding/binary"
	"time"
)

// Helpers shared by the algorithms: little-endian fields, clock clamping and the
// config fingerprint.

// stateVersion is mixed into every Fingerprint; bump it when any state layout in this
// package changes, so tables drop state written by an older build.
const stateVersion = 1

func ld64(b []byte, off int) uint64    { return binary.LittleEndian.Uint64(b[off:]) }
func st64(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
func ld32(b []byte, off int) uint32    { return binary.LittleEndian.Uint32(b[off:]) }
func st32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }

// loadState copies state into next[:size] when state has exactly size bytes and zeroes
// next[:size] otherwise (any other length is a fresh key). It reports whether state
// was usable.
func loadState(state, next []byte, size int) bool {
	next = next[:size]
	if len(state) == size {
		copy(next, state)
		return true
	}
	clear(next)
	return false
}

// MaxTime is the latest time the limiters work with (Unix ns, in the year 2225):
// later times are treated as MaxTime, so that now plus any duration a state can hold
// (at most 2·MaxRefill) never overflows int64.
const MaxTime = int64(1<<63 - 1 - 1<<60)

// clampNow treats times before the Unix epoch as the epoch and times after MaxTime as
// MaxTime.
func clampNow(now int64) int64 {
	if now < 0 {
		return 0
	}
	return min(now, MaxTime)
}

// addSat returns a+b (b >= 0) saturated at MaxInt64.
func addSat(a int64, b uint64) int64 {
	if b > uint64(1<<63-1-a) {
		return 1<<63 - 1
	}
	return a + int64(b)
}

// dur converts a non-negative nanosecond count to a Duration, saturating.
func dur(ns uint64) time.Duration {
	if ns > 1<<63-1 {
		return Never
	}
	return time.Duration(ns)
}

// fingerprint is FNV-1a (32-bit) over the state version and every parameter of a
// filled-in Config, in a fixed order.
func fingerprint(c Config) uint32 {
	h := uint32(2166136261)
	mix := func(v uint64) {
		for i := 0; i < 8; i++ {
			h ^= uint32(byte(v >> (8 * i)))
			h *= 16777619
		}
	}
	mix(stateVersion)
	mix(uint64(c.Algorithm))
	mix(c.Limit)
	mix(uint64(c.Window))
	mix(c.Burst)
	mix(uint64(c.Slots))
	if c.CalendarDay {
		mix(1)
	} else {
		mix(0)
	}
	if c.Location != nil {
		name := c.Location.String()
		mix(uint64(len(name)))
		for i := 0; i < len(name); i++ {
			mix(uint64(name[i]))
		}
	}
	mix(uint64(c.Lease))
	return h
}

// base holds what every limiter shares.
type base struct {
	cfg Config
	fp  uint32
}

func newBase(c Config) base {
	return base{cfg: c, fp: fingerprint(c)}
}

// Config returns the validated Config with defaults filled in.
func (b *base) Config() Config { return b.cfg }

// Fingerprint identifies the algorithm and parameters (FNV-1a over them).
func (b *base) Fingerprint() uint32 { return b.fp }

// copyState writes state (or zeroes, if its length is wrong) to next.
func copyState(state, next []byte, size int) { loadState(state, next, size) }
