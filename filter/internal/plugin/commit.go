package plugin

import (
	"errors"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// eval is one matching rule's evaluation of the current request.
type eval struct {
	rule           *ruleState
	keyOff, keyEnd int // the counter key in scratch.key
	hash           uint64
	bucket         int
	cost           uint64
	value          []byte // the bucket bytes read (a host buffer)
	cas            uint32
	slot           table.Slot
	nextOff        int // the next state in scratch.next
	dec            limit.Decision
	written        bool
	exhausted      bool      // denied for want of CAS retries (cas_fail_mode "closed")
	fl             fleetEval // fleet rules (fleet.go)
	// lim, when set, decides the request instead of the rule's own limiter:
	// a degraded fleet request of a small bucket (ruleState.localLimiter).
	lim limit.Limiter
	// decideCost is the cost lim decides with (cost stays what the rule's own
	// limiter was charged, for compensation).
	decideCost uint64
}

// Fail-open reasons, the values of filter state reason.
const (
	reasonNoPolicy        = "no_policy"
	reasonNoHashKey       = "no_hash_key"
	reasonCASExhausted    = "cas_exhausted"
	reasonSharedDataError = "shared_data_error"
)

// outcome is what evaluate decided: deny names the rule that denies, failed
// the fail-open reason; neither means allowed.
type outcome struct {
	deny   *eval
	failed string
	wait   bool // a fleet rule waits for quota (fleet.go)
}

// evaluate decides the request against every matching rule in s.matched and
// commits it (see the package doc's exactness argument). It fills h.report
// and h.charges' source (s.evals[i].written).
func (h *httpContext) evaluate(ps *policyState, req *rules.Request, now int64) outcome {
	p := h.p
	s := &p.s
	s.evals = s.evals[:0]
	s.key = s.key[:0]
	stateBytes := 0
	for _, i := range s.matched {
		rs := &ps.rules[i]
		start := len(s.key)
		ok := true
		if like := sameKeyEval(ps, s.evals, i); like != nil {
			// Rules on the same key parts (per second and per hour, say):
			// the values are read and escaped once.
			s.key = ps.compiled.AppendKeyLike(s.key, i, s.key[like.keyOff:like.keyEnd], like.rule.index)
		} else if s.key, ok = ps.compiled.AppendKey(s.key, i, req); !ok {
			continue // a key part has no value: the rule does not count the request
		}
		ev := eval{rule: rs, keyOff: start, keyEnd: len(s.key), nextOff: stateBytes}
		ev.hash = p.keyHash(s.key[start:])
		ev.bucket = table.BucketOf(ev.hash, len(rs.keys))
		var costOK bool
		ev.cost, costOK = ps.compiled.Cost(i, req)
		if !costOK && rs.cr.Rule.CostHeader != "" {
			if _, present := req.Header(rs.cr.Rule.CostHeader); present {
				p.m.costInvalid.Increment(1)
				proxywasm.LogDebug("sluice: rule " + rs.cr.ID + ": cost header missing a valid value, clamped or defaulted")
			}
		}
		stateBytes += rs.stateSize
		s.evals = append(s.evals, ev)
	}
	if len(s.evals) == 0 {
		return outcome{}
	}
	if cap(s.next) < stateBytes {
		s.next = make([]byte, stateBytes)
	}
	s.next = s.next[:stateBytes]
	for k := range s.evals {
		if !h.readDecide(&s.evals[k], now) {
			h.failOpenRules(reasonSharedDataError)
			return outcome{failed: reasonSharedDataError}
		}
	}
	if d := p.enforcedDenial(); d != nil {
		h.recordDenial(d)
		return outcome{deny: d}
	}
	if h.fleetPending() {
		if h.fleetWait(now) {
			return outcome{wait: true}
		}
		if d := p.enforcedDenial(); d != nil {
			h.recordDenial(d)
			return outcome{deny: d}
		}
	}
	return h.commit(now)
}

// sameKeyEval returns the latest of evals whose rule has the same key parts
// as rule i (rules.Compiled.SameKeyParts), or nil.
func sameKeyEval(ps *policyState, evals []eval, i int) *eval {
	for k := len(evals) - 1; k >= 0; k-- {
		if ps.compiled.SameKeyParts(i, evals[k].rule.index) {
			return &evals[k]
		}
	}
	return nil
}

// readDecide reads ev's bucket and decides the rule from it; false if shared
// data could not be read. A fleet rule is decided from its lease (fleet.go).
func (h *httpContext) readDecide(ev *eval, now int64) bool {
	if ev.rule.fleet.mode != fleetNone && !ev.fl.degraded {
		return h.p.readDecideFleet(ev, now, h.fq.rounds)
	}
	return h.p.readDecideLocal(ev, now)
}

// readDecideLocal is readDecide from the rule's counter bucket.
func (p *pluginContext) readDecideLocal(ev *eval, now int64) bool {
	rs := ev.rule
	value, cas, err := proxywasm.GetSharedData(rs.keys[ev.bucket])
	switch {
	case err == nil:
	case errors.Is(err, proxywasm.ErrNotFound):
		value, cas = nil, casAbsent
	default:
		proxywasm.LogDebug("sluice: reading " + rs.keys[ev.bucket] + ": " + err.Error())
		return false
	}
	ev.value, ev.cas = value, cas
	ev.slot = rs.layout.Lookup(value, ev.hash, now)
	if ev.slot.Status == table.Corrupt {
		p.m.corrupt.Increment(1)
	}
	if ev.slot.Overflow {
		p.countOverflow(rs)
	}
	lim, cost := rs.layout.Limiter(), ev.cost
	if ev.lim != nil {
		lim, cost = ev.lim, ev.decideCost
	}
	next := p.s.next[ev.nextOff : ev.nextOff+rs.stateSize] // lim's too (table.Layout.CommitAs)
	ev.dec = lim.Decide(ev.slot.State, next, now, cost)
	return true
}

// enforcedDenial returns the enforced rule that denies with the longest
// Retry-After (the request stays denied until every rule allows), or nil.
func (p *pluginContext) enforcedDenial() *eval {
	var d *eval
	for k := range p.s.evals {
		ev := &p.s.evals[k]
		if ev.dec.Allowed || ev.rule.cr.Shadow {
			continue
		}
		if d == nil || ev.dec.RetryAfter > d.dec.RetryAfter {
			d = ev
		}
	}
	return d
}

// commit writes every allowed rule's bucket by CAS, in commit order,
// re-deciding a rule whose bucket changed since it was read. Each rule
// gets cas_retries re-reads; a rule that runs out of them is handled by
// exhausted. See the package doc.
func (h *httpContext) commit(now int64) outcome {
	p := h.p
	s := &p.s
	for class := 0; class < 3; class++ {
		for k := range s.evals {
			ev := &s.evals[k]
			if ev.rule.order != class {
				continue
			}
			for retries := 0; ev.dec.Allowed && !ev.fl.skip; {
				var err error
				if ev.fl.lease {
					err = p.writeLease(ev, now)
				} else {
					err = p.writeBucket(ev, now)
				}
				if err == nil {
					ev.written = true
					break
				}
				if !errors.Is(err, proxywasm.ErrCasMismatch) {
					proxywasm.LogDebug("sluice: writing " + ev.rule.keys[ev.bucket] + ": " + err.Error())
					h.failOpenRules(reasonSharedDataError)
					h.finishAllowed()
					return outcome{failed: reasonSharedDataError}
				}
				retries++
				p.m.casRetries.Increment(1)
				if retries > p.cfg.CASRetries {
					if out, done := h.exhausted(ev, now); done {
						return out
					}
					break // a shadow rule: go on without its charge
				}
				if !h.readDecide(ev, now) {
					h.failOpenRules(reasonSharedDataError)
					h.finishAllowed()
					return outcome{failed: reasonSharedDataError}
				}
				if ev.fl.pending {
					if o, done := h.fleetCommitWait(ev, now); done {
						return o
					}
				}
				if !ev.dec.Allowed && !ev.rule.cr.Shadow {
					h.compensate(now)
					h.recordDenial(ev)
					return outcome{deny: ev}
				}
			}
		}
	}
	p.chargeUnleased(now)
	h.finishAllowed()
	return outcome{}
}

// exhausted handles ev's rule running out of CAS retries (counted in
// sluice.cas_exhausted, reason cas_exhausted). With cas_fail_mode "closed"
// (the default) an enforced rule denies the request: the charges already
// written are compensated and the rule answers with its status and
// Retry-After 1, so a contended key never admits a request it did not
// count. A shadow rule never denies: its charge is dropped and done is
// false (the commit goes on). With cas_fail_mode "open" the request passes
// uncounted by the remaining rules.
func (h *httpContext) exhausted(ev *eval, now int64) (out outcome, done bool) {
	p := h.p
	p.m.casExhausted.Increment(1)
	switch {
	case ev.rule.cr.Shadow:
		proxywasm.LogDebug("sluice: shadow rule " + ev.rule.cr.ID + ": CAS retries exhausted; its charge is dropped")
		return outcome{}, false
	case p.cfg.CASFailMode == config.FailClosed:
		proxywasm.LogDebug("sluice: rule " + ev.rule.cr.ID + ": CAS retries exhausted; request denied")
		h.compensate(now)
		ev.exhausted = true
		ev.rule.m.limited.Increment(1)
		h.recordDenial(ev)
		return outcome{deny: ev, failed: reasonCASExhausted}, true
	default:
		proxywasm.LogDebug("sluice: rule " + ev.rule.cr.ID + ": CAS retries exhausted; request passes")
		h.failOpenRules(reasonCASExhausted)
		h.finishAllowed()
		return outcome{failed: reasonCASExhausted}, true
	}
}

// writeBucket writes ev's counter bucket by CAS.
func (p *pluginContext) writeBucket(ev *eval, now int64) error {
	s := &p.s
	lim := ev.rule.layout.Limiter()
	if ev.lim != nil {
		lim = ev.lim // the record's idle time is the limiter's that decided it
	}
	size := ev.rule.layout.Size()
	if cap(s.bucket) < size {
		s.bucket = make([]byte, size)
	}
	next := s.next[ev.nextOff : ev.nextOff+ev.rule.stateSize]
	out := ev.rule.layout.CommitAs(lim, s.bucket[:0], ev.value, ev.slot, ev.hash, next, now)
	return proxywasm.SetSharedData(ev.rule.keys[ev.bucket], out, ev.cas)
}

// compensate undoes every bucket written so far for this request.
func (h *httpContext) compensate(now int64) {
	p := h.p
	for k := range p.s.evals {
		ev := &p.s.evals[k]
		if !ev.written {
			continue
		}
		ev.written = false
		var ok bool
		if ev.fl.lease {
			ok = p.undoLease(ev, now)
		} else if ev.lim != nil {
			// Through the limiter that charged it, which reads the state as
			// written (the rule's own would clamp its further-ahead TAT).
			ok = p.modify(ev.rule, ev.lim, ev.bucket, ev.hash, now, func(state, next []byte) bool {
				return ev.lim.Adjust(state, next, now, -int64(ev.decideCost))
			})
		} else {
			ok = p.undo(ev.rule, ev.bucket, ev.hash, ev.cost, now, now)
		}
		if !ok {
			p.m.compensationLost.Increment(1)
			proxywasm.LogDebug("sluice: rule " + ev.rule.cr.ID + ": could not undo the charge of a denied request")
		}
	}
}

// undo takes back a charge of cost made at acquiredAt: Release for
// concurrency, Adjust by -cost for the others (false for sliding_log,
// which cannot be corrected).
func (p *pluginContext) undo(rs *ruleState, bucket int, hash, cost uint64, acquiredAt, now int64) bool {
	lim := rs.layout.Limiter()
	if rs.concurrency {
		return p.modify(rs, lim, bucket, hash, now, func(state, next []byte) bool {
			return lim.Release(state, next, now, acquiredAt, cost)
		})
	}
	return p.modify(rs, lim, bucket, hash, now, func(state, next []byte) bool {
		return lim.Adjust(state, next, now, -int64(cost))
	})
}

// minModifyRetries is the least CAS retry budget of modify. modify takes
// back or corrects a charge already written (compensation of a denied
// request, concurrency release, response-cost correction); losing one
// leaves a count the request did not earn, so it gets a larger budget than
// a fresh decision, which can simply be denied. The path is rare (at most
// once per rule per request) and each retry is one read and one write.
const minModifyRetries = 64

// modify applies f to the key's entry in a bucket (or, if the key has none,
// to the bucket's overflow state: see table.Layout.Current) by read → f →
// CAS write, retrying up to max(cas_retries, minModifyRetries) times. It
// returns true when the change was written or there was nothing to change
// (the rule's state was reset), false when f refused or the write failed. lim
// is the limiter f edits the state with (the rule's own, or the one that
// charged it: table.Layout.CommitAs); it stamps the record's idle time.
func (p *pluginContext) modify(rs *ruleState, lim limit.Limiter, bucket int, hash uint64, now int64, f func(state, next []byte) bool) bool {
	key := rs.keys[bucket]
	s := &p.s
	for attempt := 0; ; attempt++ {
		value, cas, err := proxywasm.GetSharedData(key)
		if err != nil {
			return errors.Is(err, proxywasm.ErrNotFound)
		}
		slot := rs.layout.Current(value, hash) // its entry, else the overflow
		if !slot.Found && !slot.Overflow {
			return true
		}
		if cap(s.mod) < lim.StateSize() {
			s.mod = make([]byte, lim.StateSize())
		}
		next := s.mod[:lim.StateSize()]
		if !f(slot.State, next) {
			return false
		}
		if cap(s.modBucket) < rs.layout.Size() {
			s.modBucket = make([]byte, rs.layout.Size())
		}
		out := rs.layout.CommitAs(lim, s.modBucket[:0], value, slot, hash, next, now)
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

// recordDenial counts the denial (in every rule that denies: enforced ones
// as limited, shadow ones as shadow-limited) and sets the report from d.
func (h *httpContext) recordDenial(d *eval) {
	p := h.p
	shadow := false
	for k := range p.s.evals {
		ev := &p.s.evals[k]
		if ev.dec.Allowed {
			continue
		}
		if ev.rule.cr.Shadow {
			ev.rule.m.shadowLimited.Increment(1)
			shadow = true
		} else {
			ev.rule.m.limited.Increment(1) // every enforced rule that denies
		}
	}
	h.setReport(d, true)
	h.report.shadow = shadow
}

// finishAllowed counts an allowed (or failed-open) request and sets the
// report: the most restrictive enforced rule (least remaining), else the
// shadow rule that would have denied, else the most restrictive shadow rule.
func (h *httpContext) finishAllowed() {
	p := h.p
	var best, shadowDeny, shadowBest *eval
	for k := range p.s.evals {
		ev := &p.s.evals[k]
		switch {
		case ev.rule.cr.Shadow && !ev.dec.Allowed:
			ev.rule.m.shadowLimited.Increment(1)
			if shadowDeny == nil {
				shadowDeny = ev
			}
		case ev.rule.cr.Shadow:
			ev.rule.m.allowed.Increment(1)
			if shadowBest == nil || ev.dec.Remaining < shadowBest.dec.Remaining {
				shadowBest = ev
			}
		default:
			ev.rule.m.allowed.Increment(1)
			if best == nil || ev.dec.Remaining < best.dec.Remaining {
				best = ev
			}
		}
	}
	switch {
	case best != nil:
		h.setReport(best, false)
	case shadowDeny != nil:
		h.setReport(shadowDeny, false)
	case shadowBest != nil:
		h.setReport(shadowBest, false)
	default:
		return
	}
	h.report.shadow = shadowDeny != nil
}

// failOpenRules counts a fail-open for every rule being evaluated.
func (h *httpContext) failOpenRules(reason string) {
	for k := range h.p.s.evals {
		h.p.s.evals[k].rule.m.failedOpen.Increment(1)
	}
	h.p.m.failedOpen.Increment(1)
}

// keepCharges records the written buckets a later phase needs: concurrency
// slots to release and charges a response cost header may correct.
func (h *httpContext) keepCharges(now int64) {
	for k := range h.p.s.evals {
		ev := &h.p.s.evals[k]
		if !ev.written || ev.fl.lease || (!ev.rule.concurrency && ev.rule.cr.ResponseCostHeader == "") {
			continue
		}
		h.charges = append(h.charges, charge{rule: ev.rule, bucket: ev.bucket, hash: ev.hash, cost: ev.cost, acquiredAt: now})
	}
}
