package rules

import (
	"errors"
	"hash/fnv"
	"net/netip"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// CompileOptions are the settings Compile takes from the plugin configuration.
type CompileOptions struct {
	// Env is the environment name written into every counter key ("prod",
	// "staging"); it must satisfy ValidName. Empty means "default".
	Env string
}

// Compiled is a validated policy in the form the filter uses per request: matchers,
// key builders and one limit.Limiter per rule. It is immutable and safe for
// concurrent use; the filter builds one per policy version and swaps it.
type Compiled struct {
	// Name and Version are the policy's.
	Name    string
	Version uint64
	// Policy is the source; callers must not modify it.
	Policy *Policy

	env          string
	userHeader   string
	tenantHeader string
	exempt       exemptSet
	rules        []CompiledRule
}

// CompiledRule is one rule of a Compiled policy.
type CompiledRule struct {
	// ID is the rule's id.
	ID string
	// Rule is the source rule; callers must not modify it.
	Rule *Rule
	// Fingerprint identifies the rule's definition: a 64-bit FNV-1a hash of its
	// canonical encoding (EncodeRule) with the fields that do not change what a counter
	// means left out (description, shadow, status, exempt, scope, on_quota_failure,
	// local_share). A rule with the same id and
	// fingerprint in the next policy version keeps its counters; any other change
	// starts them afresh.
	Fingerprint uint64
	// Config is the rule's limit configuration and Limiter its algorithm.
	Config  limit.Config
	Limiter limit.Limiter
	// Status is the HTTP status of a rejection: the rule's, or 429 (503 for
	// concurrency).
	Status int
	// Shadow: count and report, never reject.
	Shadow bool
	// PeriodSeconds is the period written in counter keys: the window in whole seconds
	// rounded up, 86400 for a calendar day, 0 for concurrency.
	PeriodSeconds uint64
	// ResponseCostHeader is the rule's response_cost_header ("" if none).
	ResponseCostHeader string

	match     matcher
	exempt    exemptSet
	keyPrefix string // "rl:{env}:{policy}/{rule}:"
	keySuffix string // ":{period}s"
	globalKey string // the whole key when the rule has no key parts
	parts     [][]keyAlt
	// partsClass is the same for two rules whose key parts build the same
	// middle of a counter key for every request (SameKeyParts); -1 for a
	// rule without key parts.
	partsClass int
	// matchClass is the first rule (this one or an earlier one) whose match
	// conditions equal this rule's, so that Match decides them once.
	matchClass int
	routeValue string // escaped value of the "route" part
	cost       uint64
	costHeader string
	maxCost    uint64
}

// Compile validates p (see Policy.Validate; the error is then Errors) and builds its
// compiled form. p must not be modified afterwards.
func Compile(p *Policy, opts CompileOptions) (*Compiled, error) {
	env := opts.Env
	if env == "" {
		env = "default"
	}
	if !ValidName(env) {
		return nil, errors.New("rules: invalid env " + quoteClipped(env) + ": " + identRule)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c := &Compiled{
		Name:         p.Name,
		Version:      p.Version,
		Policy:       p,
		env:          env,
		userHeader:   p.Identity.UserHeader,
		tenantHeader: p.Identity.TenantHeader,
		exempt:       compileExempt(&p.Exempt),
		rules:        make([]CompiledRule, len(p.Rules)),
	}
	var errs Errors
	for i := range p.Rules {
		if err := c.compileRule(i, &p.Rules[i]); err != nil {
			errs = append(errs, FieldError{Field: elemPath("rules", i), Message: err.Error()})
		}
	}
	if errs != nil {
		return nil, errs
	}
	c.classifyKeyParts()
	c.classifyMatches()
	return c, nil
}

// classifyMatches sets every rule's matchClass: the first rule whose match
// conditions equal its own.
func (c *Compiled) classifyMatches() {
	for i := range c.rules {
		r := &c.rules[i]
		r.matchClass = i
		for j := range i {
			if r.match.equal(&c.rules[j].match) {
				r.matchClass = j
				break
			}
		}
	}
}

// classifyKeyParts sets every rule's partsClass: a rule whose key parts equal
// an earlier rule's (the same alternatives in the same order, and the same
// route value when a part reads the route) takes that rule's class.
func (c *Compiled) classifyKeyParts() {
	for i := range c.rules {
		r := &c.rules[i]
		r.partsClass = -1
		if len(r.parts) == 0 {
			continue
		}
		r.partsClass = i
		for j := range i {
			if sameParts(r, &c.rules[j]) {
				r.partsClass = c.rules[j].partsClass
				break
			}
		}
	}
}

// sameParts reports whether a and b build the same middle of a counter key
// (between keyPrefix and keySuffix) for every request.
func sameParts(a, b *CompiledRule) bool {
	if len(a.parts) != len(b.parts) || len(a.parts) == 0 {
		return false
	}
	for n := range a.parts {
		if len(a.parts[n]) != len(b.parts[n]) {
			return false
		}
		for k, x := range a.parts[n] {
			if x != b.parts[n][k] || x.kind == partRoute && a.routeValue != b.routeValue {
				return false
			}
		}
	}
	return true
}

func (c *Compiled) compileRule(i int, r *Rule) error {
	var v validator
	var cfg limit.Config
	if r.Descriptor != nil && r.Descriptor.Passes() {
		// Never enforced (no request matches it, the rate limit service answers
		// its descriptors OK): a placeholder limiter keeps every compiled rule
		// alike for the filter's per-rule state.
		cfg = limit.Config{Algorithm: limit.FixedWindow, Limit: limit.MaxLimit, Window: limit.MaxWindow}
	} else {
		cfg, _ = v.limitConfig(r, "")
	}
	if len(v.errs) > 0 {
		return v.errs
	}
	lim, err := limit.New(cfg)
	if err != nil {
		return err
	}
	cr := &c.rules[i]
	*cr = CompiledRule{
		ID:                 r.ID,
		Rule:               r,
		Fingerprint:        Fingerprint(r),
		Config:             cfg,
		Limiter:            lim,
		Status:             r.Status,
		Shadow:             r.Shadow,
		ResponseCostHeader: r.ResponseCostHeader,
		match: matcher{
			methods: r.Match.Methods,
			headers: r.Match.Headers,
		},
		exempt:     compileExempt(&r.Exempt),
		cost:       r.Cost,
		costHeader: r.CostHeader,
		maxCost:    r.MaxCost,
	}
	if cr.Status == 0 {
		cr.Status = 429
		if cfg.Algorithm == limit.Concurrency {
			cr.Status = 503
		}
	}
	if cr.cost == 0 {
		cr.cost = 1
	}
	switch {
	case r.Match.Path != "":
		cr.match.path, cr.match.hasPath = r.Match.Path, true
	case r.Match.PathPrefix != "":
		cr.match.path, cr.match.hasPath, cr.match.prefix = r.Match.PathPrefix, true, true
	}
	route := "*"
	if cr.match.hasPath {
		route = cr.match.path
	}
	cr.routeValue = string(appendValue(nil, route))
	switch {
	case cfg.Algorithm == limit.Concurrency:
		cr.PeriodSeconds = 0
	case cfg.CalendarDay:
		cr.PeriodSeconds = uint64(limit.CalendarDayWindow / time.Second)
	default:
		cr.PeriodSeconds = uint64((cfg.Window + time.Second - 1) / time.Second)
	}
	cr.keyPrefix = "rl:" + c.env + ":" + c.Name + "/" + r.ID + ":"
	cr.keySuffix = ":" + strconv.FormatUint(cr.PeriodSeconds, 10) + "s"
	cr.globalKey = cr.keyPrefix + "*" + cr.keySuffix
	for _, s := range r.Key {
		alts, msg := parseKeyPart(s)
		if msg != "" {
			return errors.New(msg)
		}
		cr.parts = append(cr.parts, alts)
	}
	if ds := r.Descriptor; ds != nil && !ds.HTTP {
		cr.match.never = true
		for j := range ds.Entries {
			if e := &ds.Entries[j]; !e.Exact() && !e.Shared {
				tag := string(appendEscaped([]byte("d."), e.Key))
				cr.parts = append(cr.parts, []keyAlt{{kind: partDescriptor, entry: j, tag: tag}})
			}
		}
	}
	if n := cr.longestKey(); n > MaxKeyBytes {
		return errors.New("key: its longest counter key is " + strconv.Itoa(n) + " bytes, over the " +
			strconv.Itoa(MaxKeyBytes) + " a key may have; use shorter header names or fewer key parts")
	}
	return nil
}

// longestKey returns the length of the longest counter key the rule can build, in
// bytes: every value is at most MaxKeyValueBytes (appendValue).
func (cr *CompiledRule) longestKey() int {
	if len(cr.parts) == 0 {
		return len(cr.globalKey)
	}
	n := len(cr.keyPrefix) + len(cr.keySuffix) + len(cr.parts) - 1
	for _, alts := range cr.parts {
		longest := 0
		for _, a := range alts {
			longest = max(longest, len(a.tag)+1+MaxKeyValueBytes)
		}
		n += longest
	}
	return n
}

// Fingerprint returns the rule fingerprint described on CompiledRule.Fingerprint.
func Fingerprint(r *Rule) uint64 {
	s := *r
	s.Description, s.Shadow, s.Status, s.Exempt = "", false, 0, Exempt{}
	// Scope is left out: it does not change what a counter counts, and the filter
	// enforces per Envoy either way.
	s.Scope, s.OnQuotaFailure, s.LocalSharePermille = "", "", 0
	h := fnv.New64a()
	h.Write(EncodeRule(&s))
	return h.Sum64()
}

// Len returns the number of rules.
func (c *Compiled) Len() int { return len(c.rules) }

// Rule returns rule i (0 <= i < Len()), in policy order.
func (c *Compiled) Rule(i int) *CompiledRule { return &c.rules[i] }

// Env returns the environment name used in counter keys.
func (c *Compiled) Env() string { return c.env }

// exemptSet is a compiled Exempt.
type exemptSet struct {
	prefixes []netip.Prefix
	users    map[string]struct{}
	tenants  map[string]struct{}
}

// empty reports whether the set exempts nothing (no lookup is needed).
func (s *exemptSet) empty() bool {
	return s.prefixes == nil && s.users == nil && s.tenants == nil
}

func compileExempt(e *Exempt) exemptSet {
	var s exemptSet
	for _, str := range e.CIDRs {
		if p, msg := parseCIDR(str); msg == "" {
			s.prefixes = append(s.prefixes, p)
		}
	}
	s.users = set(e.Users)
	s.tenants = set(e.Tenants)
	return s
}

func set(list []string) map[string]struct{} {
	if len(list) == 0 {
		return nil
	}
	m := make(map[string]struct{}, len(list))
	for _, s := range list {
		m[s] = struct{}{}
	}
	return m
}

// contains reports whether the request is exempt: user or tenant listed, or
// its client address in a CIDR. The address is asked of req last, so a
// request a listed id exempts never reads it.
func (s *exemptSet) contains(req *Request, user, tenant string) bool {
	if user != "" && s.users != nil {
		if _, ok := s.users[user]; ok {
			return true
		}
	}
	if tenant != "" && s.tenants != nil {
		if _, ok := s.tenants[tenant]; ok {
			return true
		}
	}
	if len(s.prefixes) == 0 {
		return false
	}
	ip := req.clientIP()
	if !ip.IsValid() {
		return false
	}
	ip = ip.Unmap()
	for _, p := range s.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
