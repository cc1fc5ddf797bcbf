package plugin

// Fleet rules on tick and at the ends of a policy and of the plugin: top-ups,
// reports and returns.

import (
	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// fleetTick reports use, tops up leases running low and returns the units
// of idle keys, once per quota_interval, in one call; it also ends calls
// whose answer never came (the waiters degrade).
func (p *pluginContext) fleetTick() {
	p.fleet.m.flush()
	now := clockNow()
	if orphans := p.fleet.orphans; len(orphans) > 0 {
		p.fleet.orphans = nil
		for _, kr := range orphans {
			p.resumeWaiters(kr)
		}
	}
	for call := range p.fleet.calls {
		if now > call.deadline {
			p.finishCall(call, nil, now)
		}
	}
	if p.pol == nil || !p.cfg.ControlPlane.Enabled || now < p.fleet.nextReport {
		return
	}
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	p.fleet.nextReport = now + interval
	var keys []*fleetKey
	var kinds []uint8
	for _, kr := range p.fleet.keys {
		if kr.call != nil {
			continue
		}
		rs := p.fleetRuleByID(kr.ruleID)
		if rs == nil {
			delete(p.fleet.keys, kr.key)
			continue
		}
		value, _, err := proxywasm.GetSharedData(rs.fleet.leaseKeys[kr.bucket])
		if err != nil {
			continue
		}
		e, _, found := fleet.Find(value, kr.hash)
		if !found {
			continue
		}
		live := e.Live(rs.cr.Fingerprint, now)
		switch {
		case live > 0 && now-e.LastUse > 3*interval:
			// Idle: give the units back; its next ask starts small again
			// (the service may have forgotten its use by then).
			kr.granted = false
			keys, kinds = append(keys, kr), append(kinds, returnKey)
		case now-e.LastUse <= 2*interval && e.Claim <= now && kr.refusedUntil <= now &&
			(live <= 2*e.Used || e.Expiry-now <= 2*interval):
			kr.want = max(kr.want, 2*e.Used)
			keys, kinds = append(keys, kr), append(kinds, askKey)
		case e.Used > 0:
			keys, kinds = append(keys, kr), append(kinds, reportKey)
		}
		if len(keys) >= quota.DefaultMaxKeys {
			break
		}
	}
	if len(keys) > 0 {
		p.sendReport(keys, kinds, now)
	}
	p.forgetIdleKeys(now, false)
}

// fleetPolicyChanged drops the worker's records of keys whose rule the new
// policy removed, made envoy-scoped or changed (their leases are void: an
// entry of another fingerprint reads as absent), resuming their waiters
// under the new policy on the next tick. Their units are not returned: the quota service
// answers a report under the old version stale_policy, and under the new one
// the rule's key is another lease; the service gets them back when the
// lease ends.
func (p *pluginContext) fleetPolicyChanged(old *policyState) {
	if old == nil || len(p.fleet.keys) == 0 {
		return
	}
	var dropped []*fleetKey
	for _, kr := range p.fleet.keys {
		var before *ruleState
		for i := range old.rules {
			if old.rules[i].cr.ID == kr.ruleID {
				before = &old.rules[i]
			}
		}
		after := p.fleetRuleByID(kr.ruleID)
		if after != nil && before != nil && before.cr.Fingerprint == after.cr.Fingerprint {
			continue
		}
		delete(p.fleet.keys, kr.key)
		kr.call = nil
		dropped = append(dropped, kr)
	}
	// Not here: a policy can be applied from a request's own callback (rule
	// sync checks for one first), and re-deciding other streams would leave
	// the effective context on them. The tick re-decides them.
	p.fleet.orphans = append(p.fleet.orphans, dropped...)
}

// fleetDone returns every unused unit this worker's keys hold, as the
// plugin goes away (Envoy may not deliver the answer; nothing waits on it).
func (p *pluginContext) fleetDone() {
	if p.pol == nil || !p.cfg.ControlPlane.Enabled || len(p.fleet.keys) == 0 {
		return
	}
	now := clockNow()
	var keys []*fleetKey
	var kinds []uint8
	for _, kr := range p.fleet.keys {
		keys, kinds = append(keys, kr), append(kinds, returnKey)
	}
	p.sendReport(keys, kinds, now)
	p.fleet.m.flush()
}
