package plugin

// Quota calls: one batched proxy_http_call per worker to the quota service,
// and its answer applied to the leases and the requests waiting on them.

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// sendQuota asks for (and reports on) keys in one call; false if the call
// could not be dispatched (the keys are then marked failed).
func (p *pluginContext) sendQuota(keys []*fleetKey, now int64) bool {
	return p.sendReport(keys, nil, now)
}

// sendReport sends one quota request for keys: per key, the units spent since
// the last report (taken from the lease entry), the units to return (for
// returnKey: the key's held units, taken from the entry) and the units wanted
// (for askKey; kinds nil means askKey for all).
func (p *pluginContext) sendReport(keys []*fleetKey, kinds []uint8, now int64) bool {
	ps := p.pol
	cp := p.cfg.ControlPlane
	if ps == nil || len(keys) == 0 {
		return true
	}
	if len(keys) > quota.DefaultMaxKeys {
		keys = keys[:quota.DefaultMaxKeys]
	}
	timeout := int64(cp.QuotaTimeout)
	if p.fleet.envoy == "" && p.hashKeyOK {
		p.fleet.envoy = envoyID(p.hashKey)
	}
	req := quota.Request{Envoy: p.fleet.envoy, Policy: ps.compiled.Name, Version: ps.version,
		Env: ps.compiled.Env(), Interval: cp.QuotaInterval, Keys: make([]quota.KeyRequest, 0, len(keys))}
	// The host answers a call past its timeout (504); the deadline only guards
	// against an answer that never comes, checked on each tick.
	call := &quotaCall{sent: now, deadline: now + timeout + 2*int64(p.cfg.Tick)}
	for i, kr := range keys {
		rs := p.fleetRuleByID(kr.ruleID)
		if rs == nil {
			continue
		}
		kind := askKey
		if kinds != nil {
			kind = kinds[i]
		}
		var used, back uint64
		fp := rs.cr.Fingerprint
		p.modifyLease(rs.fleet.leaseKeys[kr.bucket], kr.hash, now, func(e *fleet.Entry, found bool) bool {
			if !found {
				used, back = 0, 0
				return false
			}
			used, back = e.Used, 0
			e.Used = 0
			switch kind {
			case returnKey:
				back = e.Live(fp, now)
				e.Held = 0
			case askKey:
				e.Claim = now + timeout
			}
			return true
		})
		want := uint64(0)
		if kind == askKey {
			want = max(kr.want, 2*used, minWant)
			if kr.granted {
				want = max(want, sizedWant)
			}
			want = min(want, quota.MaxUnits)
		}
		kr.want = 0
		req.Keys = append(req.Keys, quota.KeyRequest{Rule: kr.ruleID, Key: kr.key, Used: min(used, quota.MaxUnits), Return: min(back, quota.MaxUnits), Want: want})
		call.keys = append(call.keys, kr)
		if kind == askKey {
			kr.call = call
		}
	}
	if len(req.Keys) == 0 {
		return true
	}
	p.fleet.buf = quota.AppendRequest(p.fleet.buf[:0], &req)
	headers := [][2]string{
		{":method", "POST"}, {":path", quotaPath}, {":authority", cp.Authority},
		{"content-type", "application/json"},
	}
	if cp.QuotaToken != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + cp.QuotaToken})
	}
	p.fleet.m.calls.Increment(1)
	_, err := proxywasm.DispatchRootHttpCall(cp.Cluster, headers, p.fleet.buf, nil, uint32(cp.QuotaTimeout.Milliseconds()),
		func(numHeaders, bodySize, _ int) { p.onQuotaAnswer(call, numHeaders, bodySize) })
	if cap(p.fleet.buf) > maxKeepBytes {
		p.fleet.buf = nil
	}
	if err != nil {
		proxywasm.LogDebug("sluice: quota call: " + err.Error())
		p.fleet.m.failures.Increment(1)
		for _, kr := range call.keys {
			if kr.call == call {
				kr.call = nil
			}
			kr.failedUntil = now + int64(cp.QuotaInterval)
		}
		return false
	}
	p.fleet.calls[call] = struct{}{}
	return true
}

// fleetRuleByID returns the fleet rule of that id in the policy in use.
func (p *pluginContext) fleetRuleByID(id string) *ruleState {
	if p.pol == nil {
		return nil
	}
	for i := range p.pol.rules {
		rs := &p.pol.rules[i]
		if rs.cr.ID == id {
			if rs.fleet.mode == fleetNone {
				return nil
			}
			return rs
		}
	}
	return nil
}

// onQuotaAnswer applies a quota answer to the leases and resumes or answers
// the requests waiting on its keys.
func (p *pluginContext) onQuotaAnswer(call *quotaCall, numHeaders, bodySize int) {
	if call.done {
		return
	}
	now := clockNow()
	var resp *quota.Response
	if numHeaders > 0 {
		status, _ := proxywasm.GetHttpCallResponseHeader(":status")
		if status == "200" {
			if bodySize > maxQuotaAnswerBytes {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: quota answer of " + strconv.Itoa(bodySize) + " bytes is over the limit")
			} else if body, err := proxywasm.GetHttpCallResponseBody(0, bodySize); err != nil {
				proxywasm.LogDebug("sluice: reading the quota answer: " + err.Error())
			} else if r, err := quota.DecodeResponse(body); err != nil {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: malformed quota answer: " + err.Error())
			} else if !answerMatches(r, call) {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: quota answer does not match the request's keys")
			} else {
				resp = r
			}
		} else {
			proxywasm.LogDebug("sluice: quota service answered " + status)
		}
	}
	p.finishCall(call, resp, now)
}

func answerMatches(r *quota.Response, call *quotaCall) bool {
	if len(r.Keys) != len(call.keys) {
		return false
	}
	for i, kr := range call.keys {
		if r.Keys[i].Key != kr.key {
			return false
		}
	}
	return true
}

// finishCall applies an answer (nil: the call failed) and handles the waiters.
func (p *pluginContext) finishCall(call *quotaCall, resp *quota.Response, now int64) {
	call.done = true
	delete(p.fleet.calls, call)
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	if resp == nil {
		p.fleet.m.failures.Increment(1)
	}
	for i, kr := range call.keys {
		if kr.call != call {
			continue // a return-only entry
		}
		kr.call = nil
		if resp == nil {
			kr.failedUntil = now + interval
			continue
		}
		p.applyResult(kr, &resp.Keys[i], call.sent, now)
	}
	for _, kr := range call.keys {
		if kr.call == nil { // not while another call for the key is in flight
			p.resumeWaiters(kr)
		}
	}
}

// applyResult adds a key's grant to the lease, or records a refusal or a
// status that degrades the key.
func (p *pluginContext) applyResult(kr *fleetKey, r *quota.KeyResult, sent, now int64) {
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	rs := p.fleetRuleByID(kr.ruleID)
	if rs == nil {
		return
	}
	switch r.Status {
	case quota.StatusGranted, quota.StatusPartial:
		kr.failedUntil, kr.refusedUntil = 0, 0
		kr.granted = kr.granted || r.Granted > 0
		fp := rs.cr.Fingerprint
		expiry := sent + int64(r.ExpiresIn)
		p.modifyLease(rs.fleet.leaseKeys[kr.bucket], kr.hash, now, func(e *fleet.Entry, found bool) bool {
			e.Claim = 0
			if r.Granted == 0 || r.ExpiresIn <= 0 {
				return found
			}
			if !found || e.Fingerprint != fp || now >= e.Expiry {
				*e = fleet.Entry{Hash: kr.hash, Fingerprint: fp, Used: e.Used, LastUse: e.LastUse}
				e.Held, e.Expiry, e.Sent = r.Granted, expiry, sent
				return true
			}
			e.Held += r.Granted
			if sent >= e.Sent {
				e.Expiry, e.Sent = expiry, sent
			} else {
				e.Expiry = min(e.Expiry, expiry)
			}
			return true
		})
		if r.Status == quota.StatusPartial && r.Granted == 0 {
			kr.refusedUntil = now + min(int64(r.RetryAfter), interval)
		}
	case quota.StatusRefused:
		p.fleet.m.refused.Increment(1)
		ra := r.RetryAfter
		if ra <= 0 || ra == limit.Never {
			ra = time.Duration(interval)
		}
		kr.retryAfter = ra
		kr.refusedUntil = now + min(int64(ra), interval)
	default: // stale_policy, unknown_rule, not_fleet, bad_key
		proxywasm.LogDebug("sluice: quota service: key of rule " + kr.ruleID + ": " + r.Status)
		kr.failedUntil = now + interval
	}
}

// resumeWaiters re-decides every request waiting on kr, each with its
// stream as the effective context: it continues, is answered, or waits again.
// A request whose stream ended meanwhile is skipped.
func (p *pluginContext) resumeWaiters(kr *fleetKey) {
	waiters := kr.waiters
	kr.waiters = nil
	for _, w := range waiters {
		h := w.h
		if h.fq.seq != w.seq || w.seq == 0 {
			continue
		}
		if err := proxywasm.SetEffectiveContext(h.fq.id); err != nil {
			h.fq.seq = 0
			continue
		}
		h.fq.seq = 0
		if h.OnHttpRequestHeaders(0, false) == types.ActionContinue {
			if err := proxywasm.ResumeHttpRequest(); err != nil {
				proxywasm.LogDebug("sluice: resuming a request: " + err.Error())
			}
		}
	}
}
