package limit

import "encoding/binary"

// time_wheel: a sliding window of Window split into Slots equal slots, kept as a ring of
// per-slot counters (the time-wheel design: rotate by the slots elapsed, zero the slots
// that fall out, count in the current slot).
//
// Slot k covers [ceil(k·Window/Slots), ceil((k+1)·Window/Slots)) Unix nanoseconds, so
// slot boundaries are exact even when Window/Slots is not a whole number of ns; slot
// index of now is floor(now·Slots/Window) (128-bit). A request of cost c at now, in
// slot i, is admitted iff the units counted in slots i-Slots+1 .. i, plus c, are at most
// Limit; it is then counted in slot i.
//
// Exact bound: in any Slots consecutive slots at most Limit units are admitted, hence
// in any time interval of length Window·(Slots-1)/Slots at most Limit; an arbitrary
// interval of length Window overlaps Slots+1 slots and may see up to Limit plus what
// was admitted in the oldest, partially overlapped slot (the granularity cost of the
// wheel; more slots, less slack). With Slots = 1 this is a fixed window aligned to the
// Unix epoch.
//
// Decision.Limit = Limit; Remaining = Limit minus the units in the current window;
// Reset = time until the newest counted slot leaves the window; RetryAfter = time until
// enough old slots leave for cost units to fit.
//
// Adjust(delta): delta > 0 counts delta more units in the current slot (saturating a
// slot at 2^32-1); delta < 0 removes |delta| units from the newest slots backwards,
// never below zero (a refund is applied to the window at now, not to the slot where the
// request was counted, which may have left the window already).
//
// State layout (8 + 4·Slots bytes, little-endian):
//
//	[0:8]          head    uint64  slot index of the newest slot written (0 = fresh)
//	[8+4j:12+4j]   count   uint32  units counted in the slot k with k mod Slots = j,
//	                               for the Slots slots k in (head-Slots, head]
//
// A head more than one window ahead of now cannot be current state and reads as fresh;
// a head less than one window ahead (another worker's clock ran slightly ahead) is
// used as is and the request is counted in slot head.
// A time wheel's state: its fixed part, then Slots counts of 4 bytes.
const (
	twHead   = 0          // uint64: slot index of the newest slot written
	twCounts = twHead + 8 // the first slot's count
)

type timeWheel struct {
	base
	limit  uint64
	window uint64
	slots  uint64
	size   int
}

func newTimeWheel(c Config) *timeWheel {
	return &timeWheel{base: newBase(c), limit: c.Limit, window: uint64(c.Window),
		slots: uint64(c.Slots), size: twCounts + 4*int(c.Slots)}
}

// StateSize is 8 + 4·Slots bytes.
func (w *timeWheel) StateSize() int { return w.size }

// index returns the slot of now (now >= 0).
func (w *timeWheel) index(now int64) uint64 {
	hi, lo := mul64(uint64(now), w.slots)
	q, _ := div128(hi, lo, w.window)
	return q
}

// start returns the first nanosecond of slot k, saturated at MaxInt64.
func (w *timeWheel) start(k uint64) int64 {
	hi, lo := mul64(k, w.window)
	q := ceilDiv128(hi, lo, w.slots)
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}

// Loops walk ring positions with these instead of dividing for every slot.
func (w *timeWheel) inc(p uint64) uint64 {
	if p++; p == w.slots {
		return 0
	}
	return p
}

func (w *timeWheel) dec(p uint64) uint64 {
	if p == 0 {
		return w.slots - 1
	}
	return p - 1
}

func (w *timeWheel) at(s []byte, p uint64) uint64 { return uint64(ld32(s, twCounts+4*int(p))) }

// rotate writes into next the state moved to now's slot and returns that slot, the
// units counted in the window ending with it, and the newest non-empty slot of that
// window (ok false if all are empty).
func (w *timeWheel) rotate(state, next []byte, now int64) (i, total, newest uint64, ok bool) {
	i = w.index(now)
	if !loadState(state, next, w.size) {
		st64(next, twHead, i)
		return i, 0, 0, false
	}
	head := ld64(next, twHead)
	switch {
	case head > i && head-i < w.slots:
		i = head
	case head > i, i-head >= w.slots:
		clear(next[8:w.size])
	default:
		p := (head + 1) % w.slots
		for k := head + 1; k <= i; k++ {
			st32(next, twCounts+4*int(p), 0)
			p = w.inc(p)
		}
	}
	st64(next, twHead, i)
	for b := next[twCounts:w.size]; len(b) >= 4; b = b[4:] {
		total += uint64(binary.LittleEndian.Uint32(b))
	}
	if total == 0 {
		return i, 0, 0, false
	}
	// The newest non-empty slot: usually the current one, so this stops at once.
	p := i % w.slots
	for m := uint64(0); m < w.slots && m <= i; m++ {
		if w.at(next, p) != 0 {
			return i, total, i - m, true
		}
		p = w.dec(p)
	}
	return i, total, 0, false
}

// Decide admits cost units iff they fit in the window of slot i; see the type comment.
func (w *timeWheel) Decide(state, next []byte, now int64, cost uint64) Decision {
	now = clampNow(now)
	i, total, newest, ok := w.rotate(state, next, now)
	d := Decision{Limit: w.limit}
	if cost <= w.limit && total+cost <= w.limit {
		off := twCounts + 4*int(i%w.slots)
		st32(next, off, ld32(next, off)+uint32(cost))
		total += cost
		if cost > 0 {
			newest, ok = i, true
		}
		d.Allowed = true
	} else if cost > w.limit {
		d.RetryAfter = Never
	} else {
		// Drop the oldest slots one by one until cost fits.
		left := total
		p := i % w.slots
		for m := uint64(1); m <= w.slots; m++ {
			p = w.inc(p) // slot i-Slots+m, at the position of i+m
			left -= w.at(next, p)
			if left+cost <= w.limit {
				d.RetryAfter = dur(uint64(max(0, w.start(i+m)-now)))
				break
			}
		}
	}
	if total < w.limit {
		d.Remaining = w.limit - total
	}
	if ok {
		d.Reset = dur(uint64(max(0, w.start(newest+w.slots)-now)))
	}
	return d
}

// Adjust counts delta more units (or removes -delta); see the type comment.
func (w *timeWheel) Adjust(state, next []byte, now int64, delta int64) bool {
	now = clampNow(now)
	i, _, _, _ := w.rotate(state, next, now)
	if delta >= 0 {
		off := twCounts + 4*int(i%w.slots)
		c := uint64(ld32(next, off)) + uint64(delta)
		if c > 1<<32-1 || c < uint64(delta) {
			c = 1<<32 - 1
		}
		st32(next, off, uint32(c))
		return true
	}
	refund := uint64(-(delta + 1)) + 1
	p := i % w.slots
	for m := uint64(0); m < w.slots && refund > 0; m++ {
		off := twCounts + 4*int(p)
		c := uint64(ld32(next, off))
		take := min(c, refund)
		st32(next, off, uint32(c-take))
		refund -= take
		p = w.dec(p)
	}
	return true
}

// Release is not supported: it copies state to next and returns false.
func (w *timeWheel) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool {
	copyState(state, next, w.size)
	return false
}

// newest returns the newest non-empty slot of state as seen at now, and false if the
// window at now is empty (or state reads as fresh).
func (w *timeWheel) newest(state []byte, now int64) (uint64, bool) {
	if len(state) != w.size {
		return 0, false
	}
	i := w.index(now)
	head := ld64(state, twHead)
	if head > i && head-i >= w.slots {
		return 0, false
	}
	p := head % w.slots
	for m := uint64(0); m < w.slots && m <= head; m++ {
		k := head - m
		if k+w.slots <= i {
			break // left the window
		}
		if w.at(state, p) != 0 {
			return k, true
		}
		p = w.dec(p)
	}
	return 0, false
}

// Idle reports whether no unit is counted in the window at now.
func (w *timeWheel) Idle(state []byte, now int64) bool {
	_, ok := w.newest(state, clampNow(now))
	return !ok
}

// IdleAt returns when the newest counted slot leaves the window (now if none).
func (w *timeWheel) IdleAt(state []byte, now int64) int64 {
	now = clampNow(now)
	k, ok := w.newest(state, now)
	if !ok {
		return now
	}
	return max(now, w.start(k+w.slots))
}
