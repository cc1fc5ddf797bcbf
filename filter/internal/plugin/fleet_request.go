package plugin

// The request path of fleet rules: spend from the lease in shared data, or
// wait for the quota service; degrade as the rule says when it cannot answer.

import (
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/internal/fleetclient"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
)

// readDecideFleet decides a fleet rule: from the lease when it holds the
// cost, else from what the worker knows of the key (refused, failed), else
// pending. rounds is the quota rounds the request has waited. False if
// shared data could not be read.
func (p *pluginContext) readDecideFleet(ev *eval, now int64, rounds int) bool {
	rs := ev.rule
	ev.fl = fleetEval{read: true}
	value, cas, err := proxywasm.GetSharedData(rs.fleet.leaseKeys[ev.bucket])
	switch {
	case errors.Is(err, proxywasm.ErrNotFound):
		value, cas = nil, casAbsent
	case err != nil:
		proxywasm.LogDebug("sluice: reading " + rs.fleet.leaseKeys[ev.bucket] + ": " + err.Error())
		return false
	}
	ev.value, ev.cas = value, cas
	lim := rs.fleet.limit
	e, _, found := fleet.Find(value, ev.hash)
	if found && e.Usable(rs.cr.Fingerprint, now, ev.cost) {
		e.Held -= ev.cost
		e.Used += ev.cost
		e.LastUse = now
		ev.fl.lease, ev.fl.entry = true, e
		ev.dec = limit.Decision{Allowed: true, Limit: lim, Remaining: e.Held, Reset: time.Duration(e.Expiry - now)}
		return true
	}
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	kr := p.fleet.client.Lookup(viewString(p.s.key[ev.keyOff:ev.keyEnd]))
	var heldUntil int64
	held := false
	if !rs.cr.Shadow {
		heldUntil, held = p.fleet.client.Held(rs.cr.ID, now)
	}
	switch {
	case !p.cfg.ControlPlane.Enabled || (kr != nil && kr.FailedUntil > now && !p.fleet.client.Reachable(kr)):
		until := now + interval
		if kr != nil {
			until = kr.FailedUntil
		}
		return p.degrade(ev, now, until)
	case held:
		// A worker of this Envoy booked a charge on a count the store lost:
		// no fresh units until the other Envoys' charges are in.
		return p.degrade(ev, now, heldUntil)
	case kr != nil && kr.RefusedUntil > now:
		ev.dec = limit.Decision{Allowed: false, Limit: lim, RetryAfter: max(kr.RetryAfter, time.Duration(kr.RefusedUntil-now)), Reset: kr.RetryAfter}
	case rounds >= maxQuotaRounds:
		// The request already waited its rounds and other requests took the
		// units granted meanwhile; the budget is not known to be spent (that
		// is a refusal, above), so the rule degrades rather than deny.
		return p.degrade(ev, now, now+interval)
	default:
		ev.fl.pending = true
		ev.dec = limit.Decision{Allowed: true, Limit: lim}
	}
	return true
}

// degrade decides ev as its rule's on_quota_failure says.
func (p *pluginContext) degrade(ev *eval, now, until int64) bool {
	rs := ev.rule
	ev.fl.degraded = true
	if !rs.cr.Shadow {
		// What the request admits without a lease, booked at the service
		// once it can be reached (chargeUnleased).
		ev.fl.charge = ev.cost
	}
	switch rs.fleet.mode {
	case fleetPass:
		ev.fl.skip = true
		ev.dec = limit.Decision{Allowed: true, Limit: rs.fleet.limit}
		return true
	case fleetDeny:
		ev.fl.charge = 0
		ev.dec = limit.Decision{Allowed: false, Limit: rs.fleet.limit, RetryAfter: max(time.Duration(until-now), time.Second), Reset: time.Duration(until - now)}
		return true
	}
	// Local: the rule's own counter holds the whole limit and every request
	// costs share times its cost there, so this Envoy admits about 1/share of
	// the limit and the n Envoys the service last saw on the key about the
	// limit together. A token_bucket or gcra whose capacity is below that
	// charge could never admit it: such a request is decided by the rule
	// refilled share times slower, which moves the same state as the charge
	// would (localLimiter), and leaves a burst of at least the request.
	share := localShare(rs.cr.Rule.LocalSharePermille, p.fleet.client.Envoys(rs.cr.ID, p.fleet.client.Lookup(viewString(p.s.key[ev.keyOff:ev.keyEnd]))))
	if left, leftUntil, ok := leftOf(ev, now); ok {
		// A fixed window: at most what the service last said the window had
		// left for this Envoy, not its share of the whole limit.
		if left == 0 {
			ev.fl.charge = 0
			ev.dec = limit.Decision{Allowed: false, Limit: rs.fleet.limit, RetryAfter: max(time.Duration(until-now), time.Second), Reset: time.Duration(leftUntil - now)}
			return true
		}
		l := max(rs.cr.Config.Limit, 1)
		share = max(share, l/left+min(l%left, 1))
	}
	perRequest := false
	if share > 1 {
		charge := satMul(ev.cost, share)
		if c := rs.cr.Config.Capacity(); c != 0 && charge > c {
			if lim := rs.localLimiter(share); lim != nil {
				ev.lim, ev.decideCost, perRequest = lim, ev.cost, true
			}
		}
		ev.cost = min(charge, max(rs.cr.Config.Limit, 1))
	}
	if !p.readDecideLocal(ev, now) {
		return false
	}
	if !perRequest {
		ev.dec.Remaining /= share
	}
	return true
}

// chargeUnleased records, once the request is admitted, what its degraded
// decisions (on_quota_failure "local" or "pass") admitted without a lease as
// a charge in their keys' lease entries: the request's cost, once. The next
// report books it at the quota service against the key's budget
// (quota.KeyRequest.Charge), so the fleet's count holds what every Envoy
// admitted: after an outage in which the service kept its count, the window
// admits L in all, and each Envoy's share of it shrinks by what it admitted by
// itself; after one in which the count was lost (Redis restarted empty), the
// fresh count starts from what the Envoys admitted meanwhile. A charge lapses
// unreported at the end of the fixed window it was made in (a window of the
// rule after it began, for the other algorithms). An edit that fails loses it
// (counted as a CAS exhaustion).
func (p *pluginContext) chargeUnleased(now int64) {
	for k := range p.s.evals {
		ev := &p.s.evals[k]
		if ev.fl.charge == 0 || !(ev.written || ev.fl.skip) {
			continue
		}
		rs := ev.rule
		until := now + int64(rs.cr.Config.Window)
		if rs.cr.Config.Algorithm == limit.FixedWindow {
			until = now + int64(windowLeft(rs, ev, now))
		}
		fp, units := rs.cr.Fingerprint, ev.fl.charge
		p.fleet.client.ModifyLease(rs.fleet.leaseKeys[ev.bucket], ev.hash, now, func(e *fleet.Entry, found bool) bool {
			if !found || e.Fingerprint != fp {
				*e = fleet.Entry{Hash: ev.hash, Fingerprint: fp}
			}
			e.AddCharge(units, now, until)
			return true
		})
	}
}

// windowLeft returns the time from now to the end of the fixed window of ev's
// rule: from the local decision when there was one (on_quota_failure
// "local"), else from the rule's limiter on an empty state.
func windowLeft(rs *ruleState, ev *eval, now int64) time.Duration {
	if ev.written && ev.lim == nil {
		return ev.dec.Reset
	}
	lim := rs.cr.Limiter
	n := lim.StateSize()
	buf := make([]byte, 2*n)
	return lim.Decide(buf[:n], buf[n:], now, 0).Reset
}

// localLimiter returns rs's limiter with its Window share times longer (the same
// Limit and Burst), or nil when rs is not a token_bucket or gcra, or that rule is
// out of bounds. Its state is rs's (tat.go: the layout depends on Limit alone), and
// a request of cost c there moves the theoretical arrival time by c·share·Window/Limit,
// exactly what a charge of share·c moves it by in rs's own limiter, so the two can
// take turns on one key as the share changes. The last one built is kept.
func (rs *ruleState) localLimiter(share uint64) limit.Limiter {
	if rs.localShareOf == share {
		return rs.local
	}
	c := rs.cr.Config
	if c.Capacity() == 0 || share > uint64(1<<62)/uint64(max(c.Window, 1)) {
		return nil
	}
	c.Window *= time.Duration(share)
	lim, err := limit.New(c)
	if err != nil {
		return nil
	}
	rs.local, rs.localShareOf = lim, share
	return lim
}

// localShare returns the divisor of a fleet rule's limit an Envoy cut off from
// the quota service enforces (on_quota_failure "local"): the number of Envoys n
// that shared the key at the service's last answer (0 when none said), but at
// most 1/local_share rounded down, so each Envoy keeps at least local_share of the
// limit (permille; 0, absent, means no floor). With n unknown it is 1/local_share
// (1 without one: the whole limit, as an envoy-scope rule).
func localShare(permille uint32, n uint32) uint64 {
	most := uint64(1) << 32
	if permille > 0 {
		most = max(1000/uint64(permille), 1)
	}
	if n == 0 {
		if permille == 0 {
			return 1
		}
		return most
	}
	return min(uint64(n), most)
}

// leftOf returns, for a fixed_window fleet rule, what the quota service last
// said the window had left for this Envoy (fleet.Entry.Left, from the lease
// entry read for ev) and when that window ends; false for another algorithm,
// with no such answer, or once that window is over (the local share is then
// the limit's, localShare).
func leftOf(ev *eval, now int64) (left uint64, until int64, ok bool) {
	rs := ev.rule
	if rs.cr.Config.Algorithm != limit.FixedWindow || !ev.fl.read {
		return 0, 0, false
	}
	e, _, found := fleet.Find(ev.value, ev.hash)
	if !found || e.Fingerprint != rs.cr.Fingerprint || now >= e.LeftUntil {
		return 0, 0, false
	}
	return e.Left, e.LeftUntil, true
}

// satMul is a·b, or the largest uint64 if that overflows.
func satMul(a, b uint64) uint64 {
	if b != 0 && a > ^uint64(0)/b {
		return ^uint64(0)
	}
	return a * b
}

// writeLease writes ev's lease entry by CAS.
func (p *pluginContext) writeLease(ev *eval, now int64) error {
	s := &p.s
	out, evicted := fleet.Put(s.bucket[:0], ev.value, ev.fl.entry, p.cfg.EntriesPerBucket, now)
	s.bucket = out[:0]
	if evicted {
		p.fleet.m.evictions.Increment(1)
	}
	return proxywasm.SetSharedData(ev.rule.fleet.leaseKeys[ev.bucket], out, ev.cas)
}

// undoLease gives a denied request's units back to the lease.
func (p *pluginContext) undoLease(ev *eval, now int64) bool {
	fp := ev.rule.cr.Fingerprint
	return p.fleet.client.ModifyLease(ev.rule.fleet.leaseKeys[ev.bucket], ev.hash, now, func(e *fleet.Entry, found bool) bool {
		if !found || e.Fingerprint != fp {
			return false
		}
		e.Held += ev.cost
		e.Used -= min(e.Used, ev.cost)
		return true
	})
}

// fleetWait runs after every rule was read: if an enforced fleet rule has
// no quota, the request waits (the worker asks for the keys not already
// asked for, in one call) and it returns true. A shadow rule without quota
// never makes a request wait: its key is asked for, and the rule counts
// nothing this time. If the call cannot be made, the pending rules degrade
// at once and it returns false.
func (h *httpContext) fleetWait(now int64) bool {
	p := h.p
	s := &p.s
	wait := false
	for k := range s.evals {
		ev := &s.evals[k]
		if ev.fl.pending && !ev.rule.cr.Shadow {
			wait = true
		}
	}
	var batch []*fleetclient.Key
	seq := uint64(0)
	if wait {
		p.fleet.seq++
		seq = p.fleet.seq
	}
	p.ensureEnvoyID()
	for k := range s.evals {
		ev := &s.evals[k]
		if !ev.fl.pending {
			continue
		}
		kr := p.fleet.client.KeyFor(p.s.key[ev.keyOff:ev.keyEnd], ev.rule.cr.ID, ev.hash, ev.bucket, now)
		if kr == nil || (wait && len(kr.Waiters) >= fleetclient.MaxKeyWaiters) {
			wait = false // no room: decide as on_quota_failure says
			batch = nil
			break
		}
		kr.Want += ev.cost
		if wait && !ev.rule.cr.Shadow {
			kr.Waiters = append(kr.Waiters, fleetclient.Waiter{Stream: h, Seq: seq})
		}
		if !kr.Asking() {
			batch = append(batch, kr)
		}
	}
	if len(batch) > 0 && !p.fleet.client.Ask(batch, now) {
		wait = false
	}
	if wait {
		h.fq.seq = seq
		h.fq.rounds++
		h.fq.waited = true
		p.fleet.m.waits.Increment(1)
		return true
	}
	// Not waiting: shadow rules count nothing; enforced ones degrade.
	for k := range s.evals {
		ev := &s.evals[k]
		if !ev.fl.pending {
			continue
		}
		ev.fl.pending = false
		if ev.rule.cr.Shadow {
			ev.fl.skip = true
			continue
		}
		until := now + int64(p.cfg.ControlPlane.QuotaInterval)
		p.degrade(ev, now, until)
	}
	return false
}

// fleetPending reports whether a rule of the request has no quota and waits
// for the quota service.
func (h *httpContext) fleetPending() bool {
	s := &h.p.s
	for k := range s.evals {
		if s.evals[k].fl.pending {
			return true
		}
	}
	return false
}

// fleetCommitWait handles a fleet rule whose lease ran dry between its
// read and its write (another worker spent it). If the request waits for
// quota, what was written is undone (the request is decided afresh when it
// resumes) and done is true. Otherwise nothing is undone and done is false:
// a shadow rule was skipped, and an enforced rule degraded as its
// on_quota_failure says, so ev.dec tells the commit what to do (write the
// local bucket, pass, or deny, which compensates then).
func (h *httpContext) fleetCommitWait(ev *eval, now int64) (outcome, bool) {
	if h.fleetWait(now) {
		h.compensate(now)
		return outcome{wait: true}, true
	}
	return outcome{}, false
}

// fleetStreamDone forgets a stream that ended, so that an answer arriving
// later does not touch it.
func (h *httpContext) fleetStreamDone() { h.fq.seq = 0 }

// fleetState is the scope and quota part of the filter state: ok when the
// reported rule is fleet-scoped (envoy-scoped rules write neither: the
// access log shows nothing), quota is "degraded" (decided by
// on_quota_failure: counted, and degraded is true), "waited" (the request
// waited for the quota service) or "local" (spent from this Envoy's lease).
func (h *httpContext) fleetState() (quota string, degraded, ok bool) {
	if !h.hasReport || h.report.rule.fleet.mode == fleetNone {
		return "", false, false
	}
	p := h.p
	for k := range p.s.evals {
		if p.s.evals[k].fl.degraded {
			degraded = true
		}
	}
	switch {
	case degraded:
		p.fleet.m.degraded.Increment(1)
		return quotaDegraded, true, true
	case h.fq.waited:
		return quotaWaited, false, true
	default:
		return quotaLocal, false, true
	}
}
