package quota

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// This file is the service's second door: assignments for Envoy's native
// rate_limit_quota filter (package rlqs), decided by the same rounds, on the same
// counter keys and in the same ledger as the filter's leases, so that both kinds of
// Envoy spend one budget.

// Why Resolve did not find a fleet rule.
const (
	ReasonUnknownPolicy = "unknown_policy" // no current policy of that name
	ReasonUnknownRule   = "unknown_rule"   // the policy has no rule of that id
	ReasonNotFleet      = "not_fleet"      // the rule is not "scope": "fleet"
	ReasonBadPolicy     = "bad_policy"     // the stored policy does not compile for the env
)

// FleetRule is a fleet rule of a policy's current version, compiled for one env. It
// is immutable; a policy change makes a new one (compare Fingerprint and Version).
type FleetRule struct {
	c   *compiled
	idx int
	// Policy and Version are the policy's name and current version.
	Policy  string
	Version uint64
	// Rule is the compiled rule (its ID, Fingerprint, Config and source Rule).
	Rule *rules.CompiledRule
}

// Resolve returns the fleet rule id of the current version of policy, compiled
// for env ("" is "default"), or nil and one of the Reason constants.
func (s *Service) Resolve(policy, env, rule string) (*FleetRule, string) {
	rec, ok := s.o.Policies.Get(policy)
	if !ok || !rec.Exists() {
		return nil, ReasonUnknownPolicy
	}
	c, err := s.compile(rec, env)
	if err != nil {
		return nil, ReasonBadPolicy
	}
	i, ok := c.byID[rule]
	switch {
	case !ok:
		return nil, ReasonUnknownRule
	case c.fleet[i] == nil:
		return nil, ReasonNotFleet
	}
	return &FleetRule{c: c, idx: i, Policy: policy, Version: rec.Version, Rule: c.c.Rule(i)}, ""
}

// FleetRuleOf returns fleet rule id of p, a policy no store holds, compiled for
// env ("" is "default"): a limit a caller makes up on the spot (a rate limit
// descriptor's limit override) decided in the same ledger as the policies'
// rules. Its counters are its fingerprint's, like any rule's. Errors: p does not
// compile, or has no fleet rule id.
func (s *Service) FleetRuleOf(p *rules.Policy, env, id string) (*FleetRule, error) {
	c, err := s.compilePolicy(p, env)
	if err != nil {
		return nil, err
	}
	i, ok := c.byID[id]
	if !ok || c.fleet[i] == nil {
		return nil, errors.New("quota: no fleet rule " + id + " in policy " + p.Name)
	}
	return &FleetRule{c: c, idx: i, Policy: p.Name, Version: p.Version, Rule: c.c.Rule(i)}, nil
}

// CountingOn returns r counting on the counters of a rule whose fingerprint
// is fp (their storage keys, StorageKey) instead of its own, with its own
// limit: the rate limit service's limit override counts on the counter of the
// rule its descriptor names, or of every override of its descriptor whatever
// the limit, as envoyproxy/ratelimit's counter is the descriptor and the
// window, not the limit. Grants under r and under the rule of fp are then one
// budget; each is decided against its own limit.
func (r *FleetRule) CountingOn(fp uint64) *FleetRule {
	c := *r.c
	c.pfx = append([]string(nil), r.c.pfx...)
	c.pfx[r.idx] = StorageKey(fp, "")
	out := *r
	out.c = &c
	return &out
}

// Key returns the counter key req is counted under, as the filter builds it
// (rules.Compiled.AppendKey), and false when a key part has no value.
func (r *FleetRule) Key(req *rules.Request) (string, bool) {
	b, ok := r.c.c.AppendKey(nil, r.idx, req)
	return string(b), ok
}

// Exempt reports whether req is exempt from the rule (the policy's or the rule's
// exemptions): never limited nor counted.
func (r *FleetRule) Exempt(req *rules.Request) bool { return r.c.c.RuleExempt(r.idx, req) }

// MaxLease returns the longest lease the rule's keys can have: the window
// (fixed_window), one slot (time_wheel) or the validity V (token_bucket, gcra;
// see newFleetLimiter). An assignment never outlives its lease.
func (r *FleetRule) MaxLease() time.Duration {
	f := r.c.fleet[r.idx]
	switch f.alg {
	case limit.FixedWindow:
		return r.Rule.Config.Window
	case limit.TimeWheel:
		return time.Duration(f.window / f.slots)
	}
	return f.validity
}

// Assignment is one key's ask through Assign.
type Assignment struct {
	// Rule and Key name the counter: Key as FleetRule.Key built it.
	Rule *FleetRule
	Key  string
	// Entry is the ledger entry's name (at most 255 bytes): Owner of the caller's
	// identity ("" without one) then a name unique to the caller's stream.
	Entry, Owner string
	// Used is units admitted under earlier assignments since the last call; Return
	// is unspent units of earlier assignments that can no longer be spent (credited
	// as the filter's returns are, at most what the entry holds); Charge is units
	// admitted without any assignment, taken from the budget even past the limit.
	Used, Return, Charge uint64
	// Want is units asked for; 0 reports only.
	Want uint64
	// Interval is the caller's report interval (sizing and the ledger's memory).
	Interval time.Duration
	// MinLife is the shortest lease worth granting: when the key's lease would end
	// sooner (the window's end is near), nothing is granted.
	MinLife time.Duration
	// Fit, when set, maps a grant of units on a lease lasting life to the largest
	// grant at most units that the caller's assignment can use whole (an Envoy
	// token bucket admits max_tokens plus its refill, in whole tokens): the service
	// grants that instead, so no unit is reserved that could never be spent.
	Fit func(units uint64, life time.Duration) uint64
	// Keep is units the caller's live assignment still holds: a grant of no more
	// would replace it for nothing (an Envoy's new token bucket replaces the old,
	// whose units come back only once it settles), so none is made and the caller
	// keeps what it has.
	Keep uint64
	// Need is units the caller must hold now to decide a request (a rate limit
	// service call of that many hits; at most Want): the grant is at least Need
	// whenever the key has that many left beyond every lease, whatever share
	// the others' reserve would otherwise leave it, so that a request the
	// budget covers is never refused for the asker's share alone.
	Need uint64
	// Reserve is the key's last units (0: none), granted a call at a time:
	// units beyond Need are granted only from what the key has left beyond
	// every lease and these, so that, once the window is down to them, no
	// holder keeps units it has not spent (a holder killed then strands
	// none, and the budget's other holders find every unit). A key whose
	// limit is at most Reserve is decided a call at a time throughout.
	Reserve uint64
}

// AssignResult is the answer to one Assignment.
type AssignResult struct {
	// Status is quota.StatusGranted, StatusPartial, StatusRefused (nothing can be
	// granted now, or the lease would be shorter than MinLife) or StatusRetry
	// (contended past the timeout: nothing recorded, ask again).
	Status string
	// Granted units, added to the entry; Returned units credited back.
	Granted, Returned uint64
	// End is when the lease ends, service clock (Unix ns); 0 when nothing is held.
	End int64
	// Tag is the window end (fixed_window) or slot (time_wheel) the grant counts
	// in; 0 for the buckets. Units of an earlier tag can no longer be returned.
	Tag uint64
	// Now is the service clock the key was decided at (Unix ns).
	Now int64
	// RetryAfter is, when less than asked was granted, how long until more may be.
	RetryAfter time.Duration
	// Left is the key's units left to grant after this ask, at Now: its limit
	// less what was admitted and what the leases and assignments out hold.
	Left uint64
	// HeldElsewhere is the units the key's other entries hold after this ask,
	// as the ledger knows them: granted, and neither reported used nor
	// returned (so it counts units spent since their holder's last report, and
	// leases ended that no round has cleared yet); 0 when every lease on the
	// key has ended. Units an asker lacks may still reach it from these: their
	// holder returns them, or spends them and reports.
	HeldElsewhere uint64
}

// Assign decides asks, each on its own key or all on distinct keys, by the same
// rounds as the filter's requests, and returns one result per ask in order. It
// returns an error wrapping ErrUnavailable, and records nothing, when the backend
// fails or does not answer within Options.Timeout.
func (s *Service) Assign(ctx context.Context, asks []Assignment) ([]AssignResult, error) {
	if len(asks) == 0 {
		return nil, nil
	}
	start := time.Now()
	ka := make([]keyAsk, len(asks))
	kr := make([]quota.KeyRequest, len(asks))
	aos := make([]assignOpts, len(asks))
	for i := range asks {
		a := &asks[i]
		if a.Rule == nil || len(a.Entry) > 255 {
			return nil, errors.New("quota: Assign needs a rule and an entry of at most 255 bytes")
		}
		kr[i] = quota.KeyRequest{Rule: a.Rule.Rule.ID, Key: a.Key, Used: a.Used, Return: a.Return, Want: a.Want, Charge: a.Charge}
		aos[i] = assignOpts{minLife: int64(a.MinLife), fit: a.Fit, keep: a.Keep, need: min(a.Need, a.Want), reserve: a.Reserve}
		ka[i] = keyAsk{w: work{idx: i, f: a.Rule.c.fleet[a.Rule.idx], skey: a.Rule.c.pfx[a.Rule.idx] + a.Key},
			envoy: a.Entry, owner: a.Owner, k: &kr[i], interval: a.Interval, ao: &aos[i]}
		s.m.touch(a.Rule.Policy, a.Rule.Rule.ID, a.Key)
	}
	s.decideAll(ctx, ka, start.Add(s.o.Timeout))
	out := make([]AssignResult, len(asks))
	for i := range ka {
		a := &ka[i]
		if a.err != nil {
			return nil, errors.Join(ErrUnavailable, a.err)
		}
		r := AssignResult{Status: a.res.Status, Granted: a.res.Granted, Returned: a.res.Returned, Tag: a.tag, Now: a.at, RetryAfter: a.res.RetryAfter, Left: aos[i].left,
			HeldElsewhere: aos[i].heldElsewhere}
		if a.res.Held > 0 {
			r.End = a.at + int64(a.res.ExpiresIn)
		}
		out[i] = r
		s.m.asked.Add(float64(kr[i].Want))
		s.m.granted.Add(float64(r.Granted))
		s.m.returned.Add(float64(r.Returned))
		s.m.keys.WithLabelValues(r.Status).Inc()
	}
	return out, nil
}
