// Package rls serves Envoy's RateLimitService (envoy.service.ratelimit.v3,
// ShouldRateLimit: the server side of the envoy.filters.http.ratelimit filter,
// the API envoyproxy/ratelimit serves) from sluice's fleet budgets. A rule with
// a descriptor (rules.Descriptor) names the descriptors it limits; each is
// decided on the rule's fleet key, from units the replica leases from the quota
// service (quota.Service.Assign) in the same ledger as the Wasm filter's leases
// and the rate limit quota service's assignments, so every kind of Envoy spends
// one budget and a warm key costs no store round trip per decision.
// docs/rls.md has the semantics, what differs from envoyproxy/ratelimit, and the
// bounds.
package rls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/controlplane/internal/grpcauth"
	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Bounds and defaults of Options.
const (
	// MaxDescriptors is the most descriptors one call may carry; a call with
	// more is refused INVALID_ARGUMENT.
	MaxDescriptors = 64
	// DefaultMaxLeases bounds the fleet keys a replica holds leases on (about
	// 300 bytes each, the key aside); a decision on a further key asks the quota
	// service by itself.
	DefaultMaxLeases = 100000
)

// Options configure New.
type Options struct {
	// Quota decides the units and authenticates the callers as POST /v1/quota
	// does (its token, identity mode). Required.
	Quota *quota.Service
	// Policies lists the current policies (snapshot.Snapshot). Required.
	Policies Policies
	// Env is the environment the rules are compiled for, as the Wasm filter's
	// "env" (counter keys carry it); "" is "default".
	Env string
	// Replica names this process's ledger entries (at most 200 bytes); default
	// the host name and a random suffix. Two replicas must not share one.
	Replica string
	// MaxLeases bounds the leases held (default DefaultMaxLeases).
	MaxLeases int
	// ShadowMode answers every call OK overall, its statuses as decided
	// (envoyproxy/ratelimit's SHADOW_MODE, src/service/ratelimit.go): a
	// call that would have been OVER_LIMIT is counted with code "shadow" in
	// sluice_controlplane_rls_requests_total.
	ShadowMode bool
	// QuotaMode decides every limited descriptor as a quota_mode one
	// (envoyproxy/ratelimit's QUOTA_MODE): over its limit it is answered OK
	// with the limit and nothing remaining, and the call is not refused for it.
	QuotaMode bool
	// DynamicMetadata answers every call with the response's dynamic
	// metadata as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA writes it
	// (ratelimitToMetadata): the domain, each descriptor's entries as
	// "key=value" strings (its limit override and hits_addend when set),
	// the call's hits_addend when not 0, the indices of the descriptors
	// answered OK by quota mode over their limit (quotaModeViolations) and
	// whether any descriptor's rule is in quota mode (quotaModeEnabled).
	DynamicMetadata bool
	// InlineRefills runs the background refills in the call that started
	// them, after its decision: a caller deciding one descriptor at a time on
	// a virtual clock (the policy lab) then depends on its inputs alone.
	InlineRefills bool
	// Recalls, when set, carry recalls between the replicas on the quota
	// service's store (RedisRecalls): a call short of units that another
	// replica's lease holds has them given back within a round trip or two
	// instead of waiting for that replica to spend them. Nil: none are sent
	// or answered (one replica, or a store of its own).
	Recalls Recalls
	// Now is the clock in Unix nanoseconds (default time.Now().UnixNano).
	Now func() int64
	// Registry receives the metrics; nil registers none.
	Registry *prometheus.Registry
	// Logger receives failures; nil means slog.Default().
	Logger *slog.Logger
}

// Server is the RateLimitService.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	o      Options
	m      *metrics
	log    *slog.Logger
	ix     indexer
	entry  string
	leases leases
	local  localLimits
	// refusals logs calls refused for their credentials.
	refusals grpcauth.RefusalLog
	// overrideRules are the rules of limit overrides (overrideRule).
	overrideMu    sync.Mutex
	overrideRules map[overrideKey]*quota.FleetRule
	// refills are the background asks waiting for a worker (Run), workers
	// how many workers run.
	refills chan refillJob
	workers atomic.Int32

	warnMu sync.Mutex
	warned map[string]int64
}

// New returns the service; Run must run beside it (the idle leases' sweep).
func New(o Options) *Server {
	if o.MaxLeases <= 0 {
		o.MaxLeases = DefaultMaxLeases
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Replica == "" {
		host, _ := os.Hostname()
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.Replica = host + "-" + hex.EncodeToString(b[:])
	}
	if len(o.Replica) > 200 {
		o.Replica = o.Replica[:200]
	}
	s := &Server{o: o, log: o.Logger, ix: indexer{p: o.Policies, log: o.Logger}, entry: "rls:" + o.Replica,
		leases: leases{m: make(map[string]*lease), max: o.MaxLeases},
		local:  localLimits{states: make(map[string]localState), max: o.MaxLeases},
		warned: make(map[string]int64), refills: make(chan refillJob, 1024), overrideRules: make(map[overrideKey]*quota.FleetRule)}
	s.m = newMetrics(o.Registry, func() float64 {
		s.leases.mu.Lock()
		defer s.leases.mu.Unlock()
		return float64(len(s.leases.m))
	})
	s.ix.m = s.m
	return s
}

// Register adds the service to g and returns its name (for health checks).
func (s *Server) Register(g *grpc.Server) string {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	return rlsv3.RateLimitService_ServiceDesc.ServiceName
}

// Run runs the background refills, answers recalls (Options.Recalls) and
// sweeps idle leases every second (their units back to the budget) until ctx
// ends.
func (s *Server) Run(ctx context.Context) {
	for range 2 * runtime.GOMAXPROCS(0) {
		go s.refillWorker(ctx)
	}
	if s.o.Recalls != nil {
		go s.subscribeRecalls(ctx)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep(ctx)
		}
	}
}

// ShouldRateLimit decides every descriptor of req (envoy.service.ratelimit.v3,
// rls.proto): OVER_LIMIT overall when any is over its limit; one status per
// descriptor, in order, with the limit, what is left and the time until the
// window resets for a descriptor a rule limits, a bare OK for one no rule
// names.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	if _, err := grpcauth.Owner(ctx, s.o.Quota, "RateLimitService calls"); err != nil {
		s.m.requests.WithLabelValues("refused").Inc()
		s.refusals.Note(ctx, s.log, "a RateLimitService call", err)
		return nil, err
	}
	switch n := len(req.GetDescriptors()); {
	case req.GetDomain() == "":
		s.m.requests.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case n == 0:
		s.m.requests.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case n > MaxDescriptors:
		s.m.requests.WithLabelValues("invalid").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "at most %d descriptors a call, got %d", MaxDescriptors, n)
	}
	ix := s.ix.get()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	// Every descriptor's rule first, for the rules they replace (as
	// envoyproxy/ratelimit's constructLimitsToCheck: a replaced limit is not
	// checked when any descriptor of the call matched the replacing one).
	var small [8]*ruleRef
	refs := small[:0]
	// violations: the descriptors over their limit answered OK by quota
	// mode; quotaModeRule: a descriptor's rule is in quota mode.
	var violations []int
	var quotaModeRule bool
	var replaced map[ruleID]bool
	for _, d := range req.Descriptors {
		ref := s.lookup(ix, req.Domain, d)
		refs = append(refs, ref)
		if ref != nil && len(ref.rule.Descriptor.Replaces) > 0 {
			if replaced == nil {
				replaced = make(map[ruleID]bool)
			}
			for _, id := range ref.rule.Descriptor.Replaces {
				replaced[ruleID{ref.policy, id}] = true
			}
		}
	}
	for i, d := range req.Descriptors {
		ref := refs[i]
		if ref != nil && replaced[ruleID{ref.policy, ref.rule.ID}] {
			ref.c.replaced.Inc()
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
			continue
		}
		var st *rlsv3.RateLimitResponse_DescriptorStatus
		var over bool // over its limit, answered OK by quota mode
		if d.GetLimit() != nil {
			st = s.decideOverride(ctx, ix, req, d, &over)
		} else {
			st = s.decide(ctx, ref, req, d, &over)
			quotaModeRule = quotaModeRule || ref != nil && ref.rule.Descriptor.QuotaMode && !ref.rule.Descriptor.Passes()
		}
		if over {
			violations = append(violations, i)
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.o.ShadowMode:
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		s.m.globalShadow.Inc()
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		s.m.overLimit.Inc()
	default:
		s.m.ok.Inc()
	}
	if s.o.DynamicMetadata {
		resp.DynamicMetadata = callMetadata(req, violations, quotaModeRule)
	}
	s.m.duration.Observe(time.Since(start).Seconds())
	return resp, nil
}

// ruleID names a rule of a policy.
type ruleID struct{ policy, id string }

// lookup returns the rule descriptor d of domain names, or nil.
func (s *Server) lookup(ix *index, domain string, d *commonrl.RateLimitDescriptor) *ruleRef {
	n := len(d.GetEntries())
	if n == 0 || n > rules.MaxDescriptorEntries {
		return nil
	}
	var kvs [rules.MaxDescriptorEntries]entryKV
	for i, e := range d.Entries {
		kvs[i] = entryKV{e.GetKey(), e.GetValue()}
	}
	if d.GetLimit() != nil {
		return nil // its own limit (decideOverride), neither replacing nor replaced
	}
	return ix.lookup(domain, kvs[:n])
}

// unlimitedStatus is an unlimited descriptor's status, as envoyproxy/ratelimit
// answers it (OK, no limit, the most remaining), shared (read-only).
var unlimitedStatus = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}

// decide decides descriptor d of req under rule ref (nil: no rule).
// over is set when the descriptor is over its limit and answered OK by quota
// mode.
func (s *Server) decide(ctx context.Context, ref *ruleRef, req *rlsv3.RateLimitRequest, d *commonrl.RateLimitDescriptor, over *bool) *rlsv3.RateLimitResponse_DescriptorStatus {
	if ref == nil {
		s.m.noRule.Inc()
		return okStatus()
	}
	if u := ref.use; u != nil {
		u.decisions.Add(1)
		u.last.Store(s.o.Now())
	}
	switch {
	case ref.rule.Descriptor.Unlimited:
		ref.c.unlimited.Inc()
		return unlimitedStatus
	case ref.rule.Descriptor.NoLimit:
		ref.c.noLimit.Inc()
		return okStatus()
	case ref.rule.Limit == 0:
		// Always over (envoyproxy/ratelimit's requests_per_unit 0): nothing
		// to count, the window's reset as for any fixed window.
		// A check of 0 hits is within it, as there (0 > 0 is false).
		w := int64(ref.rule.Window)
		return s.status(ref.c, ref.limit, ref.rule.Shadow, ref.rule.Descriptor.QuotaMode,
			outcome{admitted: hits(req, d) == 0, reset: time.Duration(w - s.o.Now()%w)}, over)
	}
	// The entries as headers, of their own length: Request keeps them, so
	// they live on the heap (a fixed array of MaxDescriptorEntries was a
	// third of the bytes this package allocated per call).
	hs := make([]rules.Header, len(d.Entries))
	for i, e := range d.Entries {
		hs[i] = rules.Header{Name: e.GetKey(), Value: e.GetValue()}
	}
	fr, reason := s.o.Quota.Resolve(ref.policy, s.o.Env, ref.rule.ID)
	if fr == nil {
		s.warn("resolve:"+reason, "rls: a descriptor rule cannot be served; its descriptors pass", "policy", ref.policy, "rule", ref.rule.ID, "reason", reason)
		s.m.noRule.Inc()
		return okStatus()
	}
	rreq, valid := ref.rule.Descriptor.Request(hs)
	key, found := fr.Key(&rreq)
	if !valid || !found {
		// An entry the rule keys on has an empty value (or a client_ip value
		// that is no address): as a request without a key part's value, not
		// counted.
		s.m.noRule.Inc()
		return okStatus()
	}
	return s.status(ref.c, ref.limit, fr.Rule.Shadow, ref.rule.Descriptor.QuotaMode, s.take(ctx, fr, key, hits(req, d)), over)
}

// okStatus is a new status answering OK with no limit.
func okStatus() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
}

// hits is what descriptor d of req costs: its own hits_addend when set (0
// included), else the request's, else 1.
func hits(req *rlsv3.RateLimitRequest, d *commonrl.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return max(uint64(req.HitsAddend), 1)
}

// status is a limited descriptor's status: its limit, what is left and the
// reset, OVER_LIMIT unless o admitted it or the rule is in shadow mode (OK,
// counted as shadow) or quota mode (OK with the limit and what remains, no
// reset, as envoyproxy/ratelimit answers a quota-mode limit passed: every
// limit's with Options.QuotaMode; *over is then set). Each descriptor is
// counted once, by its result.
func (s *Server) status(c *resultCounters, limit *rlsv3.RateLimitResponse_RateLimit, shadow, quotaMode bool, o outcome, over *bool) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       limit,
		LimitRemaining:     uint32(min(o.remaining, math.MaxUint32)),
		DurationUntilReset: seconds(o.reset),
	}
	switch {
	case o.admitted:
		c.ok.Inc()
	case shadow:
		c.shadow.Inc()
	case quotaMode || s.o.QuotaMode:
		c.quotaMode.Inc()
		st.DurationUntilReset = nil
		*over = true
	default:
		c.over.Inc()
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return st
}

// OverridePolicy is the name of the policy the rules of limit overrides are
// counted under (their counter keys rl:{env}:rls-overrides/…).
const OverridePolicy = "rls-overrides"

// decideOverride decides descriptor d, which carries its own limit (Envoy's
// rate_limits limit override, from dynamic metadata), as envoyproxy/ratelimit
// does (GetLimit): when a rule of the request's domain exists, d is limited to
// requests_per_unit per unit, counted per value of every entry, whatever rule
// its entries would match, never in shadow mode; a limit of 0 is always over.
// The limit is a fleet rule of its own (FleetRuleOf) in the ledger, one per
// domain, entry keys and limit.
func (s *Server) decideOverride(ctx context.Context, ix *index, req *rlsv3.RateLimitRequest, d *commonrl.RateLimitDescriptor, over *bool) *rlsv3.RateLimitResponse_DescriptorStatus {
	s.m.overrides.Inc()
	ok := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	lim := d.GetLimit()
	n := len(d.GetEntries())
	// envoy.type.v3.RateLimitUnit numbers its units as the response's enum
	// does (envoyproxy/ratelimit converts one to the other by number).
	unit := rlsv3.RateLimitResponse_RateLimit_Unit(lim.GetUnit())
	var window time.Duration
	for _, u := range units {
		if u.u == unit {
			window = u.d
		}
	}
	if ix.domains[req.Domain] == nil || n == 0 || n > rules.MaxDescriptorEntries || window == 0 {
		s.m.noRule.Inc()
		return ok
	}
	cl := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: lim.GetRequestsPerUnit(), Unit: unit}
	if lim.GetRequestsPerUnit() == 0 {
		return s.status(s.m.forRule(req.Domain, "(override)"), cl, false, false, outcome{reset: window}, over)
	}
	var hs [rules.MaxDescriptorEntries]rules.Header
	for i, e := range d.Entries {
		hs[i] = rules.Header{Name: e.GetKey(), Value: e.GetValue()}
	}
	var kvs [rules.MaxDescriptorEntries]entryKV
	for i, e := range d.Entries {
		kvs[i] = entryKV{e.GetKey(), e.GetValue()}
	}
	var fr *quota.FleetRule
	rreq := rules.Request{Descriptor: hs[:n]}
	if ref := ix.lookup(req.Domain, kvs[:n]); ref != nil && sameCounter(ref.rule, window) {
		// The rule these entries name counts them in windows of the
		// override's unit: one counter, as envoyproxy/ratelimit's (its key is
		// the domain, the entries and the window, whatever the limit).
		fr = s.overrideOf(ref, uint64(lim.GetRequestsPerUnit()))
		var valid bool
		if rreq, valid = ref.rule.Descriptor.Request(hs[:n]); !valid {
			fr = nil
		}
	} else {
		fr = s.overrideRule(req.Domain, hs[:n], uint64(lim.GetRequestsPerUnit()), window)
	}
	if fr == nil {
		s.m.noRule.Inc()
		return ok
	}
	key, found := fr.Key(&rreq)
	if !found {
		s.m.noRule.Inc()
		return ok
	}
	return s.status(s.m.forRule(req.Domain, "(override)"), cl, false, false, s.take(ctx, fr, key, hits(req, d)), over)
}

// sameCounter reports whether rule r counts its descriptors per value of
// every entry in epoch-aligned windows of length window: a limit override of
// that unit counts on r's counter. A rule with a shared wildcard entry counts
// every value on one counter, which an override does not (envoyproxy/ratelimit
// keys an override by the descriptor's own values).
func sameCounter(r *rules.Rule, window time.Duration) bool {
	if r.Descriptor == nil || r.Descriptor.Passes() || r.Algorithm != "fixed_window" || r.Window != window || r.Align != "" {
		return false
	}
	for i := range r.Descriptor.Entries {
		if r.Descriptor.Entries[i].Shared {
			return false
		}
	}
	return true
}

// overrideOf returns the fleet rule of a limit override of limit per window
// on the descriptors rule ref names: ref's rule with that limit, so on its
// keys; cached by the rule's policy, id and fingerprint and the limit.
func (s *Server) overrideOf(ref *ruleRef, limit uint64) *quota.FleetRule {
	cur, _ := s.o.Quota.Resolve(ref.policy, s.o.Env, ref.rule.ID)
	if cur == nil {
		return nil
	}
	k := overrideKey{policy: ref.policy, id: ref.rule.ID, fp: cur.Rule.Fingerprint, limit: limit}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	if fr, ok := s.overrideRules[k]; ok {
		return fr
	}
	r := *ref.rule
	ds := *r.Descriptor
	ds.Replaces, ds.QuotaMode = nil, false
	r.Descriptor, r.Limit, r.Shadow = &ds, limit, false
	fr, err := s.o.Quota.FleetRuleOf(&rules.Policy{Name: ref.policy, Version: 1, Rules: []rules.Rule{r}}, s.o.Env, r.ID)
	if err != nil {
		s.warn("override-rule", "rls: a limit override cannot be counted; its descriptors pass", "policy", ref.policy, "rule", r.ID, "err", err)
		fr = nil
	} else {
		fr = fr.CountingOn(cur.Rule.Fingerprint)
	}
	if len(s.overrideRules) >= maxOverrideRules {
		clear(s.overrideRules)
	}
	s.overrideRules[k] = fr
	return fr
}

// overrideRule returns the fleet rule of a limit override of limit per window
// on a descriptor of domain with entries' keys (any values) that no rule of
// the same window names: a fixed window whose keys hold every entry's value
// and not the limit (its id does not name it), so that overrides of any limit
// count on one counter, as envoyproxy/ratelimit's; cached; nil when no such
// rule can be (a key too long).
func (s *Server) overrideRule(domain string, entries []rules.Header, limit uint64, window time.Duration) *quota.FleetRule {
	h := fnv.New64a()
	h.Write([]byte(domain))
	for _, e := range entries {
		h.Write([]byte{0})
		h.Write([]byte(e.Name))
	}
	k := overrideKey{sum: h.Sum64(), limit: limit, window: window}
	s.overrideMu.Lock()
	defer s.overrideMu.Unlock()
	if fr, ok := s.overrideRules[k]; ok {
		return fr
	}
	id := "override-" + strconv.FormatUint(k.sum, 16) + "-" + strconv.FormatInt(int64(window/time.Second), 10)
	ds := &rules.Descriptor{Domain: domain}
	for _, e := range entries {
		ds.Entries = append(ds.Entries, rules.DescriptorEntry{Key: e.Name})
	}
	p := &rules.Policy{Name: OverridePolicy, Version: 1, Rules: []rules.Rule{{ID: id, Descriptor: ds,
		Algorithm: "fixed_window", Limit: limit, Window: window, Scope: rules.ScopeFleet}}}
	fr, err := s.o.Quota.FleetRuleOf(p, s.o.Env, id)
	if err != nil {
		s.warn("override-rule", "rls: a limit override cannot be counted; its descriptors pass", "domain", domain, "err", err)
		fr = nil
	} else {
		// One counter for every limit: its storage keys named by the
		// descriptor's domain, keys and window alone.
		fr = fr.CountingOn(k.sum ^ uint64(window))
	}
	if len(s.overrideRules) >= maxOverrideRules {
		clear(s.overrideRules)
	}
	s.overrideRules[k] = fr
	return fr
}

// maxOverrideRules bounds the cached rules of limit overrides.
const maxOverrideRules = 1024

// overrideKey names a limit override's rule: a digest of its domain and entry
// keys and its window (overrideRule), or the rule it counts with (overrideOf:
// policy, id, fingerprint); and the limit.
type overrideKey struct {
	sum    uint64
	window time.Duration
	policy string
	id     string
	fp     uint64
	limit  uint64
}

// units are the rate limit units of the RateLimitService API with their
// length (envoyproxy/ratelimit, src/utils/utilities.go, UnitToDivider: a month
// is 30 days, a year 365).
var units = []struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// currentLimit is a rule's limit as the API has it: its name (the
// descriptor's, "" none), the limit (requests or hits) per its window when the
// window is one unit, else UNKNOWN.
func currentLimit(name string, lim uint64, window time.Duration) *rlsv3.RateLimitResponse_RateLimit {
	cl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(lim, math.MaxUint32))}
	for _, u := range units {
		if window == u.d {
			cl.Unit = u.u
		}
	}
	return cl
}

// wholeSeconds are the durations of 0 to an hour in whole seconds, shared by
// the responses (read-only): most resets are one of them.
var wholeSeconds = func() []*durationpb.Duration {
	out := make([]*durationpb.Duration, 3601)
	for i := range out {
		out[i] = &durationpb.Duration{Seconds: int64(i)}
	}
	return out
}()

// seconds is d in whole seconds, rounded up (as envoyproxy/ratelimit's
// CalculateReset: the seconds until the window's end, never 0 for a window
// still running).
func seconds(d time.Duration) *durationpb.Duration {
	s := int64((d + time.Second - 1) / time.Second)
	if s >= 0 && s < int64(len(wholeSeconds)) {
		return wholeSeconds[s]
	}
	return &durationpb.Duration{Seconds: s}
}

func codeName(admitted bool) string {
	if admitted {
		return "ok"
	}
	return "over_limit"
}

// warn logs msg at most every 10 s per what.
func (s *Server) warn(what, msg string, args ...any) {
	now := time.Now().UnixNano()
	s.warnMu.Lock()
	last := s.warned[what]
	if now-last < int64(10*time.Second) {
		s.warnMu.Unlock()
		return
	}
	s.warned[what] = now
	s.warnMu.Unlock()
	s.log.Warn(msg, args...)
}

// callMetadata is a call's dynamic metadata as envoyproxy/ratelimit writes it
// with RESPONSE_DYNAMIC_METADATA (src/service/ratelimit.go, ratelimitToMetadata
// and descriptorToStruct): "domain"; "descriptors", each {"entries": ["key=value",
// …]} with "limit" (the override, in protobuf's text form) and "hitsAddend"
// when set; "hitsAddend" when the call's is not 0; "quotaModeViolations", the
// indices of violations, when there are any; "quotaModeEnabled", whether a
// descriptor's rule is in quota mode (the global QUOTA_MODE is not counted, as
// upstream does not).
func callMetadata(req *rlsv3.RateLimitRequest, violations []int, quotaModeRule bool) *structpb.Struct {
	ds := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, len(d.Entries))
		for i, e := range d.Entries {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(prototext.MarshalOptions{}.Format(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		ds = append(ds, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	f := map[string]*structpb.Value{
		"domain":           structpb.NewStringValue(req.Domain),
		"descriptors":      structpb.NewListValue(&structpb.ListValue{Values: ds}),
		"quotaModeEnabled": structpb.NewBoolValue(quotaModeRule),
	}
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		vs := make([]*structpb.Value, len(violations))
		for i, v := range violations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	return &structpb.Struct{Fields: f}
}
