package limit

import (
	"encoding/binary"
	"time"
)

// concurrency: at most Limit cost units (requests) in flight per key. Decide acquires
// cost slots, each leased until now+Lease; Release(acquiredAt, cost), called when the
// stream ends, frees cost slots whose lease was taken at acquiredAt; a slot never
// released (a lost stream end, a VM restarted mid-request) is reclaimed when its lease
// ends, so a lost release cannot lock a key forever. This is exact: every slot carries
// its own expiry, a release frees only a slot of its own acquisition (slots taken at
// the same nanosecond are interchangeable), and a release that comes after its lease
// was reclaimed frees nothing, so it cannot free another request's slot. Requests that
// outlive Lease stop being counted: choose a Lease above the longest legitimate stream.
//
// Decision.Limit = Limit; Remaining = free slots; Reset = time until every current
// lease has ended; RetryAfter (denied) = time until enough leases end for cost slots
// to be free, an upper bound (a release may free a slot sooner), Never if cost > Limit.
//
// Adjust is not supported: it returns false.
//
// State layout (8·Limit bytes, little-endian):
//
//	[8j:8j+8]  expiry  int64  Unix ns at which slot j's lease ends; the slot is held
//	                          iff now < expiry <= now+2·Lease (0 = free)
//
// A slot is written with expiry now+Lease, but by whichever worker committed it, and
// workers' clock readings are not ordered like their commits: a worker that read the
// clock before another but commits after it sees that worker's fresh slot up to a
// little more than one Lease ahead. So an expiry up to 2·Lease ahead is trusted (else
// that worker would zero a held slot and admit one request too many); only one further
// ahead cannot have been written by this limiter, and reads as a free slot.
type concurrency struct {
	base
	limit uint64
	lease int64
	size  int
}

func newConcurrency(c Config) *concurrency {
	return &concurrency{base: newBase(c), limit: c.Limit, lease: int64(c.Lease), size: 8 * int(c.Limit)}
}

// StateSize is 8·Limit bytes.
func (c *concurrency) StateSize() int { return c.size }

// held reports whether a slot with expiry e is held at now (see the layout: up to two
// leases ahead is trusted).
func (c *concurrency) held(e, now int64) bool { return e > now && uint64(e-now) <= 2*uint64(c.lease) }

// load copies state into next with every slot not held at now zeroed, and returns the
// number of held slots and the earliest and latest expiry among them.
func (c *concurrency) load(state, next []byte, now int64) (held uint64, earliest, latest int64) {
	next = next[:c.size]
	if len(state) != c.size {
		clear(next)
		return 0, 0, 0
	}
	copy(next, state)
	earliest = 1<<63 - 1
	for b := next; len(b) >= 8; b = b[8:] {
		e := int64(binary.LittleEndian.Uint64(b))
		if c.held(e, now) {
			held++
			latest = max(latest, e)
			earliest = min(earliest, e)
		} else if e != 0 {
			binary.LittleEndian.PutUint64(b, 0)
		}
	}
	return held, earliest, latest
}

// Decide acquires cost slots iff that many are free at now.
func (c *concurrency) Decide(state, next []byte, now int64, cost uint64) Decision {
	now = clampNow(now)
	held, earliest, latest := c.load(state, next, now)
	d := Decision{Limit: c.limit}
	switch {
	case cost > c.limit:
		d.RetryAfter = Never
	case held+cost <= c.limit:
		exp := addSat(now, uint64(c.lease))
		left := cost
		for b := next[:c.size]; len(b) >= 8 && left > 0; b = b[8:] {
			if binary.LittleEndian.Uint64(b) == 0 {
				binary.LittleEndian.PutUint64(b, uint64(exp))
				left--
			}
		}
		held += cost
		if cost > 0 {
			latest = max(latest, exp)
		}
		d.Allowed = true
	case held+cost-c.limit == 1: // one lease must end: the earliest
		d.RetryAfter = time.Duration(earliest - now)
	default:
		d.RetryAfter = time.Duration(c.kthExpiry(next, held+cost-c.limit) - now)
	}
	d.Remaining = c.limit - held
	if held > 0 {
		d.Reset = time.Duration(latest - now)
	}
	return d
}

// kthExpiry returns the k-th smallest non-zero expiry in s (1 <= k <= held slots).
func (c *concurrency) kthExpiry(s []byte, k uint64) int64 {
	var buf [MaxConcurrencyLimit]int64
	n := 0
	for j := 0; j < c.size; j += 8 {
		if e := int64(ld64(s, j)); e != 0 {
			buf[n] = e
			n++
		}
	}
	// Partial selection sort: k passes.
	var v int64
	for i := 0; i < int(k) && i < n; i++ {
		m := i
		for j := i + 1; j < n; j++ {
			if buf[j] < buf[m] {
				m = j
			}
		}
		buf[i], buf[m] = buf[m], buf[i]
		v = buf[i]
	}
	return v
}

// Adjust is not supported: it copies state to next and returns false.
func (c *concurrency) Adjust(state, next []byte, now int64, delta int64) bool {
	copyState(state, next, c.size)
	return false
}

// Release frees up to cost held slots whose lease began at acquiredAt (their expiry is
// acquiredAt+Lease); it returns true (release is supported) even if none matched.
func (c *concurrency) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool {
	now = clampNow(now)
	c.load(state, next, now)
	exp := addSat(clampNow(acquiredAt), uint64(c.lease))
	for j := 0; j < c.size && cost > 0; j += 8 {
		if int64(ld64(next, j)) == exp {
			st64(next, j, 0)
			cost--
		}
	}
	return true
}

// Idle reports whether no slot is held at now.
func (c *concurrency) Idle(state []byte, now int64) bool {
	return c.IdleAt(state, now) == clampNow(now)
}

// IdleAt returns when the last held lease ends (now if none is held).
func (c *concurrency) IdleAt(state []byte, now int64) int64 {
	now = clampNow(now)
	latest := now
	if len(state) == c.size {
		for j := 0; j < c.size; j += 8 {
			if e := int64(ld64(state, j)); c.held(e, now) {
				latest = max(latest, e)
			}
		}
	}
	return latest
}
