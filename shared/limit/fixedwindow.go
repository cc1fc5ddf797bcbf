package limit

import "time"

// fixed_window: at most Limit cost units per window, counted from zero at each window
// start. Windows are [k·Window, (k+1)·Window) Unix nanoseconds (aligned to the Unix
// epoch, so every worker and every Envoy agrees), or, with CalendarDay, local calendar
// days in Location: a window ends at the first instant whose local date differs (the
// next local midnight, or the DST jump where midnight itself is skipped), so DST days
// are 23 or 25 hours long.
//
// The well-known weakness, kept on purpose because it is what users of fixed windows
// expect: the bound holds per window only, so up to 2·Limit units can pass in a short
// time straddling a window boundary (Limit at the end of one window, Limit at the start
// of the next). time_wheel, sliding_log and gcra do not have it.
//
// Decision.Limit = Limit; Remaining = Limit minus the units counted in the window;
// Reset = time until the window ends; RetryAfter = Reset when denied (the next window
// starts empty), Never if cost > Limit.
//
// Adjust(delta) changes the count of the window containing now (saturating at 0 and
// 2^64-1): a correction that arrives after the window ended charges or refunds the new
// window, so a refund can let through at most its own size more in that window.
//
// State layout (16 bytes, little-endian):
//
//	[0:8]  end    int64   Unix ns at which the counted window ends, exclusive (0 = fresh)
//	[8:16] count  uint64  cost units admitted in that window
//
// A state whose end is at or before now belongs to a past window and reads as an empty
// window. An end later than now by more than two windows (50 hours for calendar days)
// cannot have been written by this limiter and reads as fresh; an end up to that far
// ahead (another worker's clock ran ahead across a boundary) is trusted, so the request
// counts in that later window.
type fixedWindow struct {
	base
	limit  uint64
	window int64
	loc    *time.Location // nil unless CalendarDay
	trust  int64          // how far ahead of now a stored end is believed
}

// A fixed window's state, field by field (little-endian); offsets and size
// follow from the list.
const (
	fwEnd           = 0           // int64: Unix ns the window ends
	fwCount         = fwEnd + 8   // uint64: units counted in it
	fixedWindowSize = fwCount + 8 // 16 bytes
)

func newFixedWindow(c Config) *fixedWindow {
	f := &fixedWindow{base: newBase(c), limit: c.Limit, window: int64(c.Window), trust: 2 * int64(c.Window)}
	if c.CalendarDay {
		f.loc = c.Location
		f.trust = int64(50 * time.Hour)
	}
	return f
}

// StateSize is 16 bytes.
func (f *fixedWindow) StateSize() int { return fixedWindowSize }

// windowEnd returns the exclusive end of the window containing now (now >= 0). A
// calendar day ends at the first instant whose local date differs from now's. That is
// the next local midnight, unless the clocks jump first: where DST starts at midnight
// (America/Havana, America/Santiago, Atlantic/Azores, ...) the next midnight does not
// exist and the day ends at the jump, whose first local time is 01:00 of the next
// date. Within one zone period (between two transitions, time.Time.ZoneBounds) local
// time runs with the clock, so the end is the next local midnight under that period's
// offset if it comes before the period ends, else the period's end if the local date
// differs there, else the search continues in the next period.
func (f *fixedWindow) windowEnd(now int64) int64 {
	if f.loc == nil {
		return addSat(now-now%f.window, uint64(f.window))
	}
	const day = int64(24 * time.Hour)
	y, m, d := time.Unix(0, now).In(f.loc).Date()
	cur := now
	for i := 0; i < 8; i++ { // a day spans at most a few transitions
		t := time.Unix(0, cur).In(f.loc)
		_, off := t.Zone()
		local := cur + int64(off)*int64(time.Second)
		midnight := local - local%day + day // local >= -day, since cur >= 0 and |off| < 1 day
		if local < 0 && local%day != 0 {
			midnight = local - local%day
		}
		midnight -= int64(off) * int64(time.Second)
		_, zoneEnd := t.ZoneBounds()
		if zoneEnd.IsZero() || midnight < zoneEnd.UnixNano() {
			return midnight
		}
		cur = zoneEnd.UnixNano()
		if y2, m2, d2 := time.Unix(0, cur).In(f.loc).Date(); y2 != y || m2 != m || d2 != d {
			return cur
		}
	}
	return addSat(now, uint64(CalendarDayWindow)) // unreachable with real zone data
}

// current decodes state at now: the end of the window counted in and its count.
func (f *fixedWindow) current(state []byte, now int64) (end int64, count uint64) {
	if len(state) == fixedWindowSize {
		end, count = int64(ld64(state, fwEnd)), ld64(state, fwCount)
		if end > now && end-now <= f.trust {
			return end, count
		}
	}
	return f.windowEnd(now), 0
}

// Decide admits cost units iff the window's count plus cost is at most Limit.
func (f *fixedWindow) Decide(state, next []byte, now int64, cost uint64) Decision {
	now = clampNow(now)
	end, count := f.current(state, now)
	d := Decision{Limit: f.limit, Reset: time.Duration(end - now)}
	switch {
	case cost > f.limit:
		d.RetryAfter = Never
	case count <= f.limit-cost:
		count += cost
		d.Allowed = true
	default:
		d.RetryAfter = d.Reset
	}
	if count < f.limit {
		d.Remaining = f.limit - count
	}
	st64(next, fwEnd, uint64(end))
	st64(next, fwCount, count)
	return d
}

// Adjust adds delta to the count of the window at now; see the type comment.
func (f *fixedWindow) Adjust(state, next []byte, now int64, delta int64) bool {
	now = clampNow(now)
	end, count := f.current(state, now)
	if delta >= 0 {
		if c := count + uint64(delta); c >= count {
			count = c
		} else {
			count = 1<<64 - 1
		}
	} else {
		count -= min(count, uint64(-(delta+1))+1)
	}
	st64(next, fwEnd, uint64(end))
	st64(next, fwCount, count)
	return true
}

// Release is not supported: it copies state to next and returns false.
func (f *fixedWindow) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool {
	copyState(state, next, fixedWindowSize)
	return false
}

// live reports whether state counts units in a window that has not ended at now.
func (f *fixedWindow) live(state []byte, now int64) (end int64, ok bool) {
	if len(state) != fixedWindowSize {
		return 0, false
	}
	end = int64(ld64(state, fwEnd))
	return end, ld64(state, fwCount) != 0 && end > now && end-now <= f.trust
}

// Idle reports whether the window at now has counted nothing.
func (f *fixedWindow) Idle(state []byte, now int64) bool {
	_, ok := f.live(state, clampNow(now))
	return !ok
}

// IdleAt returns the end of the counted window (now if nothing is counted).
func (f *fixedWindow) IdleAt(state []byte, now int64) int64 {
	now = clampNow(now)
	if end, ok := f.live(state, now); ok {
		return end
	}
	return now
}
