package host

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of a Host: the WASI realtime clock
// (clock_time_get with clock id 0, which Go's time.Now reads),
// proxy_get_current_time_nanoseconds and tick timers all follow it.
//
// The WASI monotonic clock (clock id 1) is deliberately not taken from the
// Clock: the Go runtime paces its garbage collector with it, and a guest
// whose monotonic clock stands still grows its heap to gigabytes
// (docs/ENVOY.md, The test host on wazero). A guest that wants virtual
// durations must therefore subtract wall-clock readings (t.UnixNano()), not
// use time.Since.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc arranges for f to be called once, d after Now, and returns
	// a function that cancels the call if it has not happened yet
	// (reporting whether it cancelled). f may block until the tick it
	// triggers has been delivered to the VM.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the real wall clock with real timers.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// VirtualClock is a Clock that only moves when told to. Tests advance it
// instead of sleeping; timers due in the advanced interval fire from
// Advance, in time order, each with Now set to its due time.
//
// A VirtualClock is safe for concurrent use, but Advance must not be
// called from code that runs on a VM's event loop (for example from an
// Upstream func), since a due tick waits for that loop.
type VirtualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*virtualTimer
	// advancing serialises Advance calls so that timers fire in order.
	advancing sync.Mutex
}

type virtualTimer struct {
	when time.Time
	seq  uint64
	f    func()
	dead bool
}

// NewVirtualClock returns a VirtualClock reading start.
func NewVirtualClock(start time.Time) *VirtualClock {
	return &VirtualClock{now: start}
}

// Now returns the clock's current time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the clock is advanced to Now()+d or
// beyond. A d ≤ 0 fires at the next Advance (even Advance(0)).
func (c *VirtualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &virtualTimer{when: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.dead {
			return false
		}
		t.dead = true
		return true
	}
}

// Advance moves the clock forward by d. Every timer due at or before the
// new time fires first, earliest first (ties in registration order), with
// Now reading the timer's due time while it runs; timers registered by a
// firing timer fire in the same Advance if they fall due within it.
// Advance returns when all of them have returned, which for a Host's tick
// timers means the ticks have been delivered to their VMs.
func (c *VirtualClock) Advance(d time.Duration) {
	c.advancing.Lock()
	defer c.advancing.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		live := c.timers[:0]
		for _, t := range c.timers {
			if !t.dead {
				live = append(live, t)
			}
		}
		c.timers = live
		sort.Slice(c.timers, func(i, j int) bool {
			a, b := c.timers[i], c.timers[j]
			if !a.when.Equal(b.when) {
				return a.when.Before(b.when)
			}
			return a.seq < b.seq
		})
		if len(c.timers) == 0 || c.timers[0].when.After(target) {
			c.now = target
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		t.dead = true
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
	}
}

// Skip moves the clock forward by d as if the process had been stopped for
// that long: every timer due by then fires once, at the new time, earliest
// due first (a tick re-armed by its callback falls due a period later, so
// it does not fire again), where Advance would fire a periodic timer once
// per period. It returns when they have returned.
func (c *VirtualClock) Skip(d time.Duration) {
	c.advancing.Lock()
	defer c.advancing.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	if target.After(c.now) {
		c.now = target
	}
	var due []*virtualTimer
	live := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.dead:
		case !t.when.After(target):
			due = append(due, t)
		default:
			live = append(live, t)
		}
	}
	c.timers = live
	sort.Slice(due, func(i, j int) bool {
		if !due[i].when.Equal(due[j].when) {
			return due[i].when.Before(due[j].when)
		}
		return due[i].seq < due[j].seq
	})
	for _, t := range due {
		t.dead = true
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// Next returns when the earliest timer falls due, false when none is set.
// Until then Advance fires nothing, so it may also run on a VM's loop (see
// Worker.DoBatch).
func (c *VirtualClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	found := false
	for _, t := range c.timers {
		if !t.dead && (!found || t.when.Before(next)) {
			next, found = t.when, true
		}
	}
	return next, found
}
