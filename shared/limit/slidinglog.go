package limit

import (
	"encoding/binary"
	"time"
)

// sliding_log: the exact sliding window. It keeps the admission time of each of the
// last Limit admitted cost units, and admits a request of cost c at now iff fewer than
// Limit-c+1 units were admitted in (now-Window, now]. So in every half-open interval of
// Window nanoseconds, wherever it starts, at most Limit units are admitted: no
// boundary burst, no slot granularity. A request of cost c > 1 is recorded as c units
// at the same time (cost up to Limit; more is never admitted). The price is a state of
// 8 bytes per unit of Limit, hence MaxSlidingLogLimit: this is for small limits (a few
// logins per minute, a few expensive calls per hour).
//
// Decision.Limit = Limit; Remaining = Limit minus the units admitted in
// (now-Window, now]; Reset = time until the newest of them is older than Window;
// RetryAfter = time until the c-th oldest of the kept units is older than Window.
//
// Adjust is not supported (a log records admissions, not amounts): it returns false.
//
// State layout (8 + 8·Limit bytes, little-endian):
//
//	[0:8]          pos    uint64  ring position of the oldest kept unit, < Limit
//	[8+8j:16+8j]   stamp  uint64  0 = empty, else admission time + 1 (Unix ns + 1)
//
// Logical entry n (0 = oldest, Limit-1 = newest) is at ring position (pos+n) mod Limit;
// stamps never decrease along it: a unit is recorded at max(now, newest stamp), so a
// worker whose clock is slightly behind keeps the order (and is conservative). A state
// with pos >= Limit, stamps out of order, or a newest stamp more than one Window ahead
// of now reads as fresh.
// A sliding log's state: its fixed part, then Limit stamps of 8 bytes.
const (
	slPos    = 0         // uint64: ring position of the oldest kept unit
	slStamps = slPos + 8 // the first stamp
)

type slidingLog struct {
	base
	limit  uint64
	window int64
	size   int
}

func newSlidingLog(c Config) *slidingLog {
	return &slidingLog{base: newBase(c), limit: c.Limit, window: int64(c.Window), size: slStamps + 8*int(c.Limit)}
}

// StateSize is 8 + 8·Limit bytes.
func (s *slidingLog) StateSize() int { return s.size }

// stamp returns logical entry n of st (0 if empty).
func (s *slidingLog) stamp(st []byte, pos, n uint64) uint64 {
	i := pos + n // pos, n < Limit: one subtraction wraps it, no division
	if i >= s.limit {
		i -= s.limit
	}
	return ld64(st, slStamps+8*int(i))
}

// decode validates st at now and returns pos; ok is false if st reads as fresh.
func (s *slidingLog) decode(st []byte, now int64) (pos uint64, ok bool) {
	if len(st) != s.size {
		return 0, false
	}
	pos = ld64(st, slPos)
	if pos >= s.limit {
		return 0, false
	}
	// Stamps never decrease from oldest to newest (empty ones, 0, come first), and the
	// newest is at most one Window ahead of now.
	ring := st[8:s.size]
	p := 8 * int(pos)
	prev := uint64(0)
	for _, b := range [2][]byte{ring[p:], ring[:p]} {
		for ; len(b) >= 8; b = b[8:] {
			v := binary.LittleEndian.Uint64(b)
			if v < prev {
				return 0, false
			}
			prev = v
		}
	}
	if prev > uint64(now)+uint64(s.window)+1 {
		return 0, false
	}
	return pos, true
}

// inWindow reports whether a stamp counts at now: admitted in (now-Window, now].
func (s *slidingLog) inWindow(stamp uint64, now int64) bool {
	return stamp != 0 && int64(stamp-1) > now-s.window
}

// firstIn returns the logical index of the oldest kept unit still in the window at
// now (Limit if none), by binary search over the sorted log.
func (s *slidingLog) firstIn(st []byte, pos uint64, now int64) uint64 {
	lo, hi := uint64(0), s.limit
	for lo < hi {
		mid := (lo + hi) / 2
		if s.inWindow(s.stamp(st, pos, mid), now) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// Decide admits cost units iff they fit in the window ending at now.
func (s *slidingLog) Decide(state, next []byte, now int64, cost uint64) Decision {
	now = clampNow(now)
	pos, ok := s.decode(state, now)
	if ok {
		copy(next[:s.size], state)
	} else {
		clear(next[:s.size])
	}
	d := Decision{Limit: s.limit}
	first := s.firstIn(next, pos, now)
	count := s.limit - first
	switch {
	case cost > s.limit:
		d.RetryAfter = Never
	case cost <= first: // the cost oldest kept units are out of the window
		if cost > 0 {
			at := uint64(now) + 1
			if newest := s.stamp(next, pos, s.limit-1); newest > at {
				at = newest
			}
			for c := uint64(0); c < cost; c++ {
				i := pos + c
				if i >= s.limit {
					i -= s.limit
				}
				st64(next, slStamps+8*int(i), at)
			}
			if pos += cost; pos >= s.limit {
				pos -= s.limit
			}
			st64(next, slPos, pos)
			count += cost
		}
		d.Allowed = true
	default:
		// The unit at logical cost-1 must leave: at stamp-1+Window.
		d.RetryAfter = time.Duration(max(0, int64(s.stamp(next, pos, cost-1)-1)+s.window-now))
	}
	d.Remaining = s.limit - count
	if count > 0 {
		d.Reset = time.Duration(max(0, int64(s.stamp(next, pos, s.limit-1)-1)+s.window-now))
	}
	return d
}

// Adjust is not supported: it copies state to next and returns false.
func (s *slidingLog) Adjust(state, next []byte, now int64, delta int64) bool {
	copyState(state, next, s.size)
	return false
}

// Release is not supported: it copies state to next and returns false.
func (s *slidingLog) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool {
	copyState(state, next, s.size)
	return false
}

// newestIn returns the admission time of the newest kept unit if it is in the window
// at now.
func (s *slidingLog) newestIn(state []byte, now int64) (int64, bool) {
	pos, ok := s.decode(state, now)
	if !ok {
		return 0, false
	}
	st := s.stamp(state, pos, s.limit-1)
	return int64(st - 1), s.inWindow(st, now)
}

// Idle reports whether nothing admitted in (now-Window, now] is kept.
func (s *slidingLog) Idle(state []byte, now int64) bool {
	_, ok := s.newestIn(state, clampNow(now))
	return !ok
}

// IdleAt returns when the newest kept unit leaves the window (now if none is in it).
func (s *slidingLog) IdleAt(state []byte, now int64) int64 {
	now = clampNow(now)
	if at, ok := s.newestIn(state, now); ok {
		return max(now, addSat(at, uint64(s.window)))
	}
	return now
}
