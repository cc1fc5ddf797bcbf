package policysync

import (
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

// The lease: at most one worker per Envoy holds it (compare-and-swap on one
// shared-data key, with an expiry) and keeps the long poll open.

// renewLease takes the lease if it is free or expired, or renews it if
// this instance holds it, by compare-and-swap on the lease key.
func (s *Syncer) renewLease(now int64) {
	val, cas, err := s.h.GetSharedData(s.leaseKey)
	if errors.Is(err, proxywasm.ErrNotFound) {
		// No canary created it (Start): create it free, then CAS as usual.
		s.createKeys()
		val, cas, err = s.h.GetSharedData(s.leaseKey)
	}
	if err != nil {
		s.setHolding(false, now)
		return
	}
	cur, _ := DecodeLease(val)
	next, take := NextLease(cur, s.me, now, s.o.Lease)
	if !take {
		s.setHolding(false, now)
		return
	}
	if err := s.h.SetSharedData(s.leaseKey, AppendLease(nil, next), cas); err != nil {
		s.setHolding(false, now) // another worker won the race
		return
	}
	s.setHolding(true, now)
}

// NextLease decides the lease step of instance me at now (Unix ns): if cur
// is free (Holder 0), expired (ExpiryNanos ≤ now) or already me's, it
// returns me's lease until now + ttl and take true, to be written by
// compare-and-swap; otherwise take is false and another holder keeps it.
func NextLease(cur Lease, me uint64, now int64, ttl time.Duration) (next Lease, take bool) {
	if cur.Holder != me && cur.Holder != 0 && cur.ExpiryNanos > now {
		return cur, false
	}
	return Lease{Holder: me, ExpiryNanos: now + int64(ttl)}, true
}

func (s *Syncer) setHolding(h bool, now int64) {
	if h == s.holding {
		return
	}
	s.holding = h
	if !h {
		s.log.info("lost the sync lease")
		return
	}
	// A new holder polls at once, from the published version's ETag.
	s.etag = ""
	if val, _, err := s.h.GetSharedData(s.metaKey); err == nil {
		if m, ok := DecodeMeta(val); ok {
			s.etag = m.ETag
		}
	}
	s.nextPoll = now
	s.log.info("took the sync lease (lease " + s.o.Lease.String() + ", wait " + s.o.Wait.String() + ")")
}
