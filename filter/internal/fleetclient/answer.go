package fleetclient

// Answers: what the service's answer does to the keys and their leases.

import (
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// answer handles a call's answer.
func (c *Client) answer(cl *call, status string, body []byte) {
	if cl.done {
		return
	}
	var resp *quota.Response
	switch {
	case status == "":
	case status != "200":
		c.host.Debug("sluice: quota service answered " + status)
	case body == nil:
		inc(c.m.BadAnswers, 1)
		c.host.Debug("sluice: quota answer unreadable or too large")
	default:
		r, err := quota.DecodeResponse(body)
		switch {
		case err != nil:
			inc(c.m.BadAnswers, 1)
			c.host.Debug("sluice: malformed quota answer: " + err.Error())
		case !matches(r, cl):
			inc(c.m.BadAnswers, 1)
			c.host.Debug("sluice: quota answer does not match the request's keys")
		default:
			resp = r
			c.charges = c.charges || r.Charges
		}
	}
	c.finish(cl, resp, c.host.Now())
}

func matches(r *quota.Response, cl *call) bool {
	if len(r.Keys) != len(cl.keys) {
		return false
	}
	for i, k := range cl.keys {
		if r.Keys[i].Key != k.Key {
			return false
		}
	}
	return true
}

// finish applies an answer (nil: the call failed) and resumes the waiters.
func (c *Client) finish(cl *call, resp *quota.Response, now int64) {
	pol := c.policy()
	cl.done = true
	delete(c.calls, cl)
	interval := int64(c.cfg.Interval)
	if resp == nil {
		inc(c.m.Failures, 1)
	}
	for i, k := range cl.keys {
		var r Rule
		ok := false
		if pol != nil && pol.Rule != nil {
			r, ok = pol.Rule(k.RuleID)
		}
		switch {
		case resp != nil && !quota.Recorded(resp.Keys[i].Status) && resp.Keys[i].Status != quota.StatusBadKey:
			// Nothing was recorded for the key (retry; or a policy mismatch, as
			// after the store lost the policy and it was written back under a
			// new epoch, which the next sync resolves): what the report took,
			// its charge included, goes back. A key the rule cannot build
			// (bad_key) never will be recorded: its report is dropped.
			if resp.Keys[i].Status == quota.StatusRetry {
				inc(c.m.Retried, 1)
			}
			if ok {
				c.restore(k, r, cl.items[i], now)
			}
		case resp == nil && ok:
			// The call failed (a non-200 status, no answer, an unreadable one):
			// the service may or may not have recorded the report. The used
			// units go into the next report (reported twice, they only lower
			// what the service counts as held), and so does the charge (booked
			// twice, it takes from the budget units that were not admitted: the
			// side that never admits past the limit); the returned ones are not
			// held again, since the service may have credited them already: they
			// end with the lease.
			it := cl.items[i]
			it.back = 0
			c.restore(k, r, it, now)
		}
		var hold int64
		if resp != nil && quota.Recorded(resp.Keys[i].Status) && cl.items[i].charge > 0 &&
			lostOthers(k.Envoys, resp.Keys[i].Envoys) && c.mayHold(k.RuleID, now) {
			hold = now + chargeHold*interval // see Held
		}
		if resp != nil && resp.Keys[i].Envoys > 0 {
			// Reports answer it too: every key of the call learns the fleet's size.
			k.Envoys = resp.Keys[i].Envoys
			c.ruleEnvoys[k.RuleID] = k.Envoys
		}
		left := resp != nil && ok && quota.Recorded(resp.Keys[i].Status) && resp.Keys[i].LeftFor > 0
		if resp != nil && ok && (hold > 0 || i == 0 || cl.keys[i-1].RuleID != k.RuleID) {
			// Every worker learns the service answers, its count, and a hold.
			c.noteAnswer(r, resp.Keys[i].Envoys, now, hold)
		}
		if k.call != cl {
			// Not asked by this call. A key degraded for want of an answer
			// stays so until its interval ends (or another worker of the Envoy
			// was answered, Reachable), however its own report fared.
			k.hold(hold)
			if left {
				c.noteLeft(k, r, &resp.Keys[i], cl.sent, now)
			}
			continue
		}
		k.call = nil
		if resp == nil {
			k.FailedUntil, k.unreachedAt = now+interval, now
			continue
		}
		if ok {
			c.apply(k, r, &resp.Keys[i], cl.sent, now)
			if left { // after the grant, which makes the key's entry
				c.noteLeft(k, r, &resp.Keys[i], cl.sent, now)
			}
		} else {
			k.FailedUntil = now + interval
		}
		k.hold(hold)
	}
	for _, k := range cl.keys {
		if k.call == nil { // not while another call for the key is in flight
			c.resume(k)
		}
	}
}

func (c *Client) resume(k *Key) {
	if c.Resume != nil && len(k.Waiters) > 0 {
		c.Resume(k)
	}
}

// restore puts back into the lease what a report took out when the service
// recorded nothing of it (quota.StatusRetry, or a call never sent; after a failed
// call, the used units and the charge alone): the used units and the charge
// are reported again next time (the charge until it lapses), and returned
// units are held again if the very lease they were taken from is still live
// under the same rule (else they end with it, as the service's ledger says: a
// newer lease never gets them).
func (c *Client) restore(k *Key, r Rule, it item, now int64) {
	if it.used == 0 && it.back == 0 && it.charge == 0 {
		return
	}
	fp := r.Fingerprint
	c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
		if !found || e.Fingerprint != fp {
			return false
		}
		e.Used += it.used
		if it.charge > 0 && now < it.chargeUntil {
			e.AddCharge(it.charge, now, it.chargeUntil)
		}
		if it.back > 0 && now < e.Expiry && e.Sent == it.leaseSent {
			e.Held += it.back
		}
		return true
	})
}

// noteLeft keeps in k's lease entry what the answer res to a call sent at
// sent, applied at now, said the Envoy may admit by itself in the key's window
// (fleet.Entry.Left), until the window's end measured from the send (the
// service decided later, so the entry's end comes no later than the window's).
// A key without an entry gets none for it (making one could evict a live
// lease from a full bucket: units lost for a number); an unchanged one is not
// written.
func (c *Client) noteLeft(k *Key, r Rule, res *quota.KeyResult, sent, now int64) {
	fp, until := r.Fingerprint, sent+int64(res.LeftFor)
	c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
		if !found || e.Fingerprint != fp || (e.Left == res.Left && e.LeftUntil == until) {
			return false
		}
		e.Left, e.LeftUntil = res.Left, until
		return true
	})
}

// apply applies one key's result: a grant goes into the lease; a refusal or a
// status that degrades the key is recorded.
func (c *Client) apply(k *Key, r Rule, res *quota.KeyResult, sent, now int64) {
	interval := int64(c.cfg.Interval)
	switch res.Status {
	case quota.StatusGranted, quota.StatusPartial:
		k.FailedUntil, k.RefusedUntil, k.unreachedAt = 0, 0, 0
		k.granted = k.granted || res.Granted > 0
		if res.Granted > 0 && res.ExpiresIn > 0 {
			c.applyGrant(k, r, now) // an earlier grant first, if one is waiting
			g := grant{units: res.Granted, expiresIn: res.ExpiresIn, sent: sent, fresh: res.Held <= res.Granted}
			if u := k.unapplied; u != nil {
				// Still not applied: both wait, ending with the earlier lease.
				end := min(u.sent+int64(u.expiresIn), sent+int64(res.ExpiresIn))
				g = grant{units: u.units + g.units, sent: max(u.sent, sent), fresh: g.fresh}
				g.expiresIn = time.Duration(end - g.sent)
			}
			k.unapplied = &g
			c.applyGrant(k, r, now)
		} else {
			fp := r.Fingerprint
			c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
				if !found || e.Fingerprint != fp || e.Claim == 0 {
					return false
				}
				e.Claim = 0 // answered: another worker may ask
				return true
			})
		}
		if res.Status == quota.StatusPartial && res.Granted == 0 {
			k.RefusedUntil = now + min(int64(res.RetryAfter), interval)
		}
	case quota.StatusRefused:
		inc(c.m.Refused, 1)
		ra := res.RetryAfter
		if ra <= 0 || ra == limit.Never {
			ra = time.Duration(interval)
		}
		k.RetryAfter = ra
		k.RefusedUntil = now + min(int64(ra), interval)
	case quota.StatusRetry:
		// The service could not decide in time: the lease stays as it is, the
		// key degrades (never denies for this) and is asked again soon.
		ra := res.RetryAfter
		if ra <= 0 {
			ra = time.Duration(interval)
		}
		k.FailedUntil, k.unreachedAt = now+min(int64(ra), interval), 0
	default: // stale_policy, unknown_rule, not_fleet, bad_key
		c.host.Debug("sluice: quota service: key of rule " + k.RuleID + ": " + res.Status)
		k.FailedUntil, k.unreachedAt = now+interval, 0
	}
}

// applyGrant adds k's unapplied grant to its lease; if the edit fails the grant
// stays unapplied (counted) for the next tick, until it has expired. A fresh grant
// (the service's entry holds nothing else) replaces the lease instead: units the
// service no longer counts as this Envoy's (its entry was reclaimed, or a lease of
// an earlier call ended there) keep no place in a lease whose end they never had,
// so an old grant is never extended by a new answer.
func (c *Client) applyGrant(k *Key, r Rule, now int64) {
	g := k.unapplied
	if g == nil {
		return
	}
	expiry := g.sent + int64(g.expiresIn)
	if now >= expiry {
		k.unapplied = nil // the lease it belonged to is over: nothing to spend
		return
	}
	fp := r.Fingerprint
	ok := c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
		e.Claim = 0
		if !found || e.Fingerprint != fp {
			*e = fleet.Entry{Hash: k.Hash, Fingerprint: fp, Used: e.Used, LastUse: e.LastUse}
		}
		units := g.units
		if now >= e.Expiry || g.fresh && g.sent >= e.Sent {
			e.Held, e.Expiry, e.Sent = units, expiry, g.sent
			return true
		}
		e.Held += units
		if g.sent >= e.Sent {
			e.Expiry, e.Sent = expiry, g.sent
		} else {
			e.Expiry = min(e.Expiry, expiry)
		}
		return true
	})
	if ok {
		k.unapplied = nil
		return
	}
	inc(c.m.Unapplied, 1)
}

// hold keeps k degraded until at least until (0: no hold), its degraded
// interval then coming from a booked charge, not a missing answer (Held).
func (k *Key) hold(until int64) {
	if until > k.FailedUntil {
		k.FailedUntil, k.unreachedAt = until, 0
	}
}

// lostOthers reports whether an answer counting now Envoys on a key that the
// service's last answer for that very key counted before (0 unknown: a key new
// to this worker, whose fresh ledger says nothing of a loss) lost some: after a
// store lost the key's count, its ledger knows only those that reported since,
// so the others' charges are still to come (Client.Held).
func lostOthers(before, now uint32) bool {
	return before > 1 && now > 0 && now < before
}
