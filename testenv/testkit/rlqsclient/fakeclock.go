package rlqsclient

import (
	"sort"
	"sync"
	"time"
)

// FakeClock is a Clock moved only by Advance, for simulations: timers run in
// time order, each at its own instant, on the goroutine that calls Advance.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	seq    int
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Duration
	seq     int
	f       func()
	stopped bool
}

// NewFakeClock returns a FakeClock reading now (the monotonic time: how long the
// simulated host has been up).
func NewFakeClock(now time.Duration) *FakeClock { return &FakeClock{now: now} }

// Now implements Clock.
func (c *FakeClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements Clock.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{at: c.now + max(d, 0), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return func() {
		c.mu.Lock()
		t.stopped = true
		c.mu.Unlock()
	}
}

// Advance moves the clock by d, running every timer due on the way at its time.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now + d
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.Slice(c.timers, func(i, j int) bool {
			if c.timers[i].at != c.timers[j].at {
				return c.timers[i].at < c.timers[j].at
			}
			return c.timers[i].seq < c.timers[j].seq
		})
		if len(c.timers) == 0 || c.timers[0].at > end {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		c.now = max(c.now, t.at)
		stopped := t.stopped
		c.mu.Unlock()
		if !stopped {
			t.f()
		}
	}
}
