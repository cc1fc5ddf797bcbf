package fleetclient

// Reports and asks: what the worker sends, in calls within the service's limits.

import (
	"math/bits"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// Ask asks the service for keys (reporting their use) in as few calls as
// their size allows; false if a call could not be dispatched (its keys then
// degrade for an interval).
func (c *Client) Ask(keys []*Key, now int64) bool {
	return c.send(c.policy(), keys, nil, now)
}

// Tick ends calls whose answer never came, re-decides the waiters of keys a
// policy change dropped, applies grants whose lease edit failed, and, once per
// quota interval, reports use, tops up leases running low (runsLow) and
// returns the units of idle keys, in as few calls as their size allows; on the
// ticks in between it tops up leases that would run dry before the next
// report (followUp). With no policy nothing is reported.
func (c *Client) Tick(now int64) {
	pol := c.policy()
	if orphans := c.orphans; len(orphans) > 0 {
		c.orphans = nil
		for _, k := range orphans {
			c.resume(k)
		}
	}
	for cl := range c.calls {
		if now > cl.deadline {
			c.finish(cl, nil, now)
		}
	}
	if pol == nil {
		return
	}
	for _, k := range c.keys {
		if k.unapplied != nil {
			if r, ok := pol.Rule(k.RuleID); ok {
				c.applyGrant(k, r, now)
			} else {
				k.unapplied = nil
			}
		}
	}
	interval := int64(c.cfg.Interval)
	if c.nextReport == 0 {
		// The first report is an interval after the first tick with a policy,
		// however late that tick runs: what was used before it is reported then.
		c.nextReport = now + interval
	}
	if now < c.nextReport {
		c.followUp(pol, now)
		return
	}
	c.nextReport = now + interval
	var keys []*Key
	var kinds []Kind
	for _, k := range c.keys {
		if k.call != nil {
			continue
		}
		r, ok := pol.Rule(k.RuleID)
		if !ok {
			delete(c.keys, k.Key)
			continue
		}
		value, _, err := c.host.GetSharedData(r.LeaseKeys[k.Bucket])
		if err != nil {
			continue
		}
		e, _, found := fleet.Find(value, k.Hash)
		if !found || e.Fingerprint != r.Fingerprint {
			continue
		}
		// Requests spending from the lease never touch the record: the lease
		// says when the key was last used.
		k.lastSeen = max(k.lastSeen, e.LastUse)
		live := e.Live(r.Fingerprint, now)
		switch {
		case live > 0 && now-e.LastUse > 3*interval:
			// Idle: give the units back; its next ask starts small again
			// (the service may have forgotten its use by then).
			k.granted = false
			keys, kinds = append(keys, k), append(kinds, Return)
		case now-e.LastUse <= 2*interval && e.Claim <= now && k.RefusedUntil <= now &&
			(runsLow(r, e, live, now, interval) || e.Expiry-now <= 2*interval):
			k.Want = max(k.Want, 2*e.Used)
			keys, kinds = append(keys, k), append(kinds, Ask)
		case e.Used > 0 || (c.charges && e.Charge > 0):
			keys, kinds = append(keys, k), append(kinds, Report)
		}
	}
	if len(keys) > 0 {
		c.send(pol, keys, kinds, now)
	}
	c.forgetIdle(now, false)
}

// followUp asks, between reports, for the keys whose lease would run dry at
// the Envoy's rate before this worker's next report and its answer (two
// ticks), so that their requests do not wait for a call. A report tops a lease
// up to a little more than an interval at the rate the service saw; a rising
// rate, a late tick or a slow answer eats that margin. A rate needs two ticks
// of use since the last report to be judged. Each lease bucket is read once.
func (c *Client) followUp(pol *Policy, now int64) {
	tick := int64(c.cfg.Tick)
	until := c.nextReport - now + 2*tick
	var keys []*Key
	for _, k := range c.keys {
		if k.call != nil || k.RefusedUntil > now || k.FailedUntil > now {
			continue
		}
		r, ok := pol.Rule(k.RuleID)
		if !ok || r.Windowed {
			continue
		}
		name := r.LeaseKeys[k.Bucket]
		value, read := c.followBuckets[name]
		if !read {
			v, _, err := c.host.GetSharedData(name)
			if err != nil {
				v = nil
			}
			start := len(c.followBuf)
			c.followBuf = append(c.followBuf, v...)
			value = c.followBuf[start:len(c.followBuf):len(c.followBuf)]
			c.followBuckets[name] = value
		}
		e, _, found := fleet.Find(value, k.Hash)
		if !found || e.Fingerprint != r.Fingerprint || e.Claim > now || e.Used == 0 ||
			e.Reported == 0 || now-e.Reported < 2*tick || now-e.LastUse > 2*tick {
			continue
		}
		// live ≤ Used/elapsed × until: gone before the report's answer.
		if mulAtMost(e.Live(r.Fingerprint, now), uint64(now-e.Reported), e.Used, uint64(until)) {
			keys = append(keys, k)
		}
	}
	clear(c.followBuckets)
	c.followBuf = c.followBuf[:0]
	if cap(c.followBuf) > maxKeepBytes {
		c.followBuf = nil
	}
	if len(keys) > 0 {
		kinds := make([]Kind, len(keys))
		for i := range kinds {
			kinds[i] = Ask
		}
		c.send(pol, keys, kinds, now)
	}
}

// runsLow reports whether the live units of lease e last at most two report
// intervals at the Envoy's rate: e.Used over the time since any worker last
// reported (e.Reported; one interval when none did, or longer ago). A lease is
// topped up to a little more than one interval's worth, so a key in steady use
// asks at every report, whichever worker makes it. A windowed rule's lease is judged
// by the worker's own use (Rule.Windowed).
func runsLow(r Rule, e fleet.Entry, live uint64, now, interval int64) bool {
	if r.Windowed {
		return live <= 2*e.Used // this worker's own use (Rule.Windowed)
	}
	elapsed := interval
	if e.Reported > 0 && e.Reported < now && now-e.Reported < interval {
		elapsed = now - e.Reported
	}
	return mulAtMost(live, uint64(elapsed), e.Used, 2*uint64(interval))
}

// mulAtMost reports whether a·b ≤ c·d, the products taken in 128 bits.
func mulAtMost(a, b, c, d uint64) bool {
	h1, l1 := bits.Mul64(a, b)
	h2, l2 := bits.Mul64(c, d)
	return h1 < h2 || (h1 == h2 && l1 <= l2)
}

// PolicyChanged drops the records of keys whose rule the new policy removed,
// made envoy-scoped or changed (same(id) false: their leases are void, as an
// entry of another fingerprint reads as absent); the next Tick re-decides
// their waiters under the new policy. Their units are not returned: the service
// answers a report under the old version stale_policy, and under the new one
// the rule's key is another lease; it gets them back when the lease ends.
func (c *Client) PolicyChanged(same func(ruleID string) bool) {
	for name, k := range c.keys {
		if same(k.RuleID) {
			continue
		}
		delete(c.keys, name)
		k.call = nil
		c.orphans = append(c.orphans, k)
	}
}

// Done returns every unused unit the worker's keys hold, as the plugin goes
// away (Envoy may not deliver the answer; nothing waits on it).
func (c *Client) Done(now int64) {
	pol := c.policy()
	if pol == nil || len(c.keys) == 0 {
		return
	}
	keys := make([]*Key, 0, len(c.keys))
	kinds := make([]Kind, 0, len(c.keys))
	for _, k := range c.keys {
		keys, kinds = append(keys, k), append(kinds, Return)
	}
	c.send(pol, keys, kinds, now)
}

// send reports on keys (kinds nil: Ask for all) in calls of at most MaxKeys
// keys and MaxBytes bytes each; false if one could not be dispatched.
func (c *Client) send(pol *Policy, keys []*Key, kinds []Kind, now int64) bool {
	if pol == nil || len(keys) == 0 {
		return true
	}
	timeout := int64(c.cfg.Timeout)
	cl := &call{sent: now, deadline: now + timeout + 2*int64(c.cfg.Tick)}
	var reqs []quota.KeyRequest
	for i, k := range keys {
		r, ok := pol.Rule(k.RuleID)
		if !ok {
			continue
		}
		kind := Ask
		if kinds != nil {
			kind = kinds[i]
		}
		it := item{kind: kind}
		fp := r.Fingerprint
		var used, back, charge uint64
		var leaseSent, chargeUntil int64
		written := c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
			used, back, charge, leaseSent = 0, 0, 0, e.Sent
			if !found {
				return false
			}
			used = e.Used
			e.Used, e.Reported = 0, now
			if c.charges {
				charge, chargeUntil = e.TakeCharge(now)
			}
			switch kind {
			case Return:
				back = e.Live(fp, now)
				e.Held = 0
			case Ask:
				e.Claim = now + timeout
			}
			return true
		})
		if written {
			it.used, it.back, it.leaseSent = used, back, leaseSent
			it.charge, it.chargeUntil = charge, chargeUntil
		} // else nothing was taken out of the lease: report nothing, return nothing
		want := uint64(0)
		// An ask that books a charge asks for nothing yet (Client.Held).
		if kind == Ask && it.charge == 0 {
			want = max(k.Want, 2*it.used, MinWant)
			if k.granted {
				want = max(want, SizedWant)
			}
			want = min(want, quota.MaxUnits)
		}
		if kind != Ask && it.used == 0 && it.back == 0 && it.charge == 0 {
			continue // nothing to say
		}
		k.Want = 0
		reqs = append(reqs, quota.KeyRequest{Rule: k.RuleID, Key: k.Key, Used: min(it.used, quota.MaxUnits), Return: min(it.back, quota.MaxUnits),
			Want: want, Charge: min(it.charge, quota.MaxUnits)})
		if kind == Ask {
			it.asked = true
			k.call = cl
		}
		cl.keys = append(cl.keys, k)
		cl.items = append(cl.items, it)
	}
	if len(reqs) == 0 {
		return true
	}
	base := quota.Request{Envoy: c.Envoy, Policy: pol.Name, Version: pol.Version, Env: pol.Env, Interval: c.cfg.Interval}
	ok := true
	for _, part := range c.cut(&base, reqs) {
		sub := &call{sent: cl.sent, deadline: cl.deadline, keys: cl.keys[part.from:part.to], items: cl.items[part.from:part.to]}
		for j, k := range sub.keys {
			if sub.items[j].asked {
				k.call = sub
			}
		}
		base.Keys = reqs[part.from:part.to]
		if !c.dispatch(pol, sub, &base, now) {
			ok = false
		}
	}
	return ok
}

type span struct{ from, to int }

// cut splits reqs into runs of at most MaxKeys keys whose request documents
// (base with those keys) encode to at most MaxBytes. A key too large to fit
// even alone (it cannot be: keys are at most quota.MaxKeyBytes) would travel
// alone and be refused alone.
func (c *Client) cut(base *quota.Request, reqs []quota.KeyRequest) []span {
	var out []span
	var stack []span
	stack = append(stack, span{0, len(reqs)})
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := s.to - s.from
		if n > 1 && (n > c.cfg.MaxKeys || c.size(base, reqs[s.from:s.to]) > c.cfg.MaxBytes) {
			mid := s.from + n/2
			stack = append(stack, span{mid, s.to}, span{s.from, mid}) // first half on top: keeps order
			continue
		}
		out = append(out, s)
	}
	return out
}

func (c *Client) size(base *quota.Request, keys []quota.KeyRequest) int {
	base.Keys = keys
	c.buf = quota.AppendRequest(c.buf[:0], base)
	return len(c.buf)
}

// dispatch sends one call; on failure its keys degrade for an interval and
// what the report took out of the leases is restored.
func (c *Client) dispatch(pol *Policy, cl *call, req *quota.Request, now int64) bool {
	c.buf = quota.AppendRequest(c.buf[:0], req)
	inc(c.m.Calls, 1)
	err := c.host.Call(c.buf, c.cfg.Timeout, func(status string, body []byte) { c.answer(cl, status, body) })
	if cap(c.buf) > maxKeepBytes {
		c.buf = nil
	}
	if err != nil {
		c.host.Debug("sluice: quota call: " + err.Error())
		inc(c.m.Failures, 1)
		cl.done = true
		for j, k := range cl.keys {
			if k.call == cl {
				k.call = nil
			}
			k.FailedUntil, k.unreachedAt = now+int64(c.cfg.Interval), now
			// Never sent: nothing was recorded, so what the report took goes back.
			if r, ok := pol.Rule(k.RuleID); ok {
				c.restore(k, r, cl.items[j], now)
			}
		}
		return false
	}
	c.calls[cl] = struct{}{}
	return true
}
