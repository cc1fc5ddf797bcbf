package plugin

// The request path of fleet rules: spend from the lease in shared data, or
// wait for the quota service; degrade as the rule says when it cannot answer.

import (
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// readDecideFleet decides a fleet rule: from the lease when it holds the
// cost, else from what the worker knows of the key (refused, failed), else
// pending. False if shared data could not be read.
func (p *pluginContext) readDecideFleet(ev *eval, now int64) bool {
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
	lim := rs.cr.Config.Limit
	e, _, found := fleet.Find(value, ev.hash)
	if found && e.Usable(rs.cr.Fingerprint, now, ev.cost) {
		e.Held -= ev.cost
		e.Used += ev.cost
		e.LastUse = now
		ev.fl.lease, ev.fl.entry = true, e
		ev.dec = limit.Decision{Allowed: true, Limit: lim, Remaining: e.Held, Reset: time.Duration(e.Expiry - now)}
		return true
	}
	kr := p.fleet.keys[viewString(p.s.key[ev.keyOff:ev.keyEnd])]
	switch {
	case !p.cfg.ControlPlane.Enabled || (kr != nil && kr.failedUntil > now):
		until := now + int64(p.cfg.ControlPlane.QuotaInterval)
		if kr != nil {
			until = kr.failedUntil
		}
		return p.degrade(ev, now, until)
	case kr != nil && kr.refusedUntil > now:
		ev.dec = limit.Decision{Allowed: false, Limit: lim, RetryAfter: max(kr.retryAfter, time.Duration(kr.refusedUntil-now)), Reset: kr.retryAfter}
	case p.fleet.round() >= maxQuotaRounds:
		// The request already waited its rounds (other requests took the
		// units granted meanwhile): deny, as a refusal would.
		ev.dec = limit.Decision{Allowed: false, Limit: lim, RetryAfter: time.Second, Reset: time.Second}
	default:
		ev.fl.pending = true
		p.fleet.pending++
		ev.dec = limit.Decision{Allowed: true, Limit: lim}
	}
	return true
}

// round is the quota rounds of the request being decided.
func (w *fleetWorker) round() int { return w.curRounds }

// degrade decides ev as its rule's on_quota_failure says.
func (p *pluginContext) degrade(ev *eval, now, until int64) bool {
	rs := ev.rule
	ev.fl.degraded = true
	switch rs.fleet.mode {
	case fleetPass:
		ev.fl.skip = true
		ev.dec = limit.Decision{Allowed: true, Limit: rs.cr.Config.Limit}
		return true
	case fleetDeny:
		ev.dec = limit.Decision{Allowed: false, Limit: rs.cr.Config.Limit, RetryAfter: max(time.Duration(until-now), time.Second), Reset: time.Duration(until - now)}
		return true
	}
	return p.readDecideLocal(ev, now)
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

// modifyLease applies f to the entry of hash in a lease bucket by read → f
// → CAS write, retrying up to max(cas_retries, minModifyRetries) times (a
// lost correction leaves units spent that no request used). f gets the entry (found
// reports whether it existed) and returns false to write nothing.
func (p *pluginContext) modifyLease(key string, hash uint64, now int64, f func(e *fleet.Entry, found bool) bool) bool {
	for attempt := 0; ; attempt++ {
		value, cas, err := proxywasm.GetSharedData(key)
		switch {
		case errors.Is(err, proxywasm.ErrNotFound):
			value, cas = nil, casAbsent
		case err != nil:
			return false
		}
		e, _, found := fleet.Find(value, hash)
		if !found {
			e = fleet.Entry{Hash: hash}
		}
		if !f(&e, found) {
			return true
		}
		out, _ := fleet.Put(p.s.modBucket[:0], value, e, p.cfg.EntriesPerBucket, now)
		p.s.modBucket = out[:0]
		err = proxywasm.SetSharedData(key, out, cas)
		if err == nil {
			return true
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			return false
		}
		p.m.casRetries.Increment(1)
		if attempt >= max(p.cfg.CASRetries, minModifyRetries) {
			p.m.casExhausted.Increment(1)
			return false
		}
	}
}

// undoLease gives a denied request's units back to the lease.
func (p *pluginContext) undoLease(ev *eval, now int64) bool {
	fp := ev.rule.cr.Fingerprint
	return p.modifyLease(ev.rule.fleet.leaseKeys[ev.bucket], ev.hash, now, func(e *fleet.Entry, found bool) bool {
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
	p.fleet.pending = 0
	s := &p.s
	wait := false
	for k := range s.evals {
		ev := &s.evals[k]
		if ev.fl.pending && !ev.rule.cr.Shadow {
			wait = true
		}
	}
	var batch []*fleetKey
	seq := uint64(0)
	if wait {
		p.fleet.seq++
		seq = p.fleet.seq
	}
	for k := range s.evals {
		ev := &s.evals[k]
		if !ev.fl.pending {
			continue
		}
		kr := p.fleetKeyFor(ev, now)
		if kr == nil || (wait && len(kr.waiters) >= maxKeyWaiters) {
			wait = false // no room: decide as on_quota_failure says
			batch = nil
			break
		}
		kr.want += ev.cost
		if wait && !ev.rule.cr.Shadow {
			kr.waiters = append(kr.waiters, fleetWaiter{h: h, seq: seq})
		}
		if kr.call == nil {
			batch = append(batch, kr)
		}
	}
	if len(batch) > 0 && !p.sendQuota(batch, now) {
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

// fleetKeyFor returns the worker's record of ev's key, creating it (nil if
// the key is longer than quota.MaxKeyBytes, or if the worker already
// remembers maxFleetKeys keys and none can be dropped).
func (p *pluginContext) fleetKeyFor(ev *eval, now int64) *fleetKey {
	key := viewString(p.s.key[ev.keyOff:ev.keyEnd])
	if kr := p.fleet.keys[key]; kr != nil {
		kr.lastSeen = now
		return kr
	}
	if len(key) > quota.MaxKeyBytes {
		// The service would refuse the whole batch (HTTP 400) for it: such a
		// key (a client's oversized header) never travels, and degrades.
		return nil
	}
	if len(p.fleet.keys) >= maxFleetKeys {
		p.forgetIdleKeys(now, true)
		if len(p.fleet.keys) >= maxFleetKeys {
			return nil
		}
	}
	kr := &fleetKey{key: string(p.s.key[ev.keyOff:ev.keyEnd]), ruleID: ev.rule.cr.ID, hash: ev.hash, bucket: ev.bucket, lastSeen: now}
	p.fleet.keys[kr.key] = kr
	return kr
}

// forgetIdleKeys drops records of keys with no call, no waiters and no
// recent use (any such key when force).
func (p *pluginContext) forgetIdleKeys(now int64, force bool) {
	idle := now - 10*int64(p.cfg.ControlPlane.QuotaInterval)
	for k, kr := range p.fleet.keys {
		if kr.call == nil && len(kr.waiters) == 0 && (force || kr.lastSeen < idle) && kr.refusedUntil < now && kr.failedUntil < now {
			delete(p.fleet.keys, k)
		}
	}
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
