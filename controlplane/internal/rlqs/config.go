package rlqs

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"time"

	xdscorev3 "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	networkinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/controlplane/internal/envoyboot"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// ConfigOptions shape the Envoy configuration EnvoyConfig generates.
type ConfigOptions struct {
	// Env is the filter's domain: the env of the counter keys (default "default").
	Env string
	// ReportingInterval is each bucket's reporting_interval (default 1 s; Envoy
	// requires more than 100 ms, and today reports every EnvoyReportInterval
	// whatever it says: the server learns the interval from the reports).
	ReportingInterval time.Duration
	// ControlPlane is the control plane's gRPC address, host:port (--grpc-listen;
	// default 127.0.0.1:8081).
	ControlPlane string
	// Upstream is the service's address, host:port (default 127.0.0.1:8000), and
	// Listen the listener's (default 127.0.0.1:10000).
	Upstream, Listen string
	// Admin is the admin endpoint's address, host:port (default 127.0.0.1:9901).
	Admin string
	// Token is the quota token sent as "authorization: Bearer …" metadata; empty
	// sends none (an open or certificate-authenticated control plane).
	Token string
}

// ErrNoFleetRule is returned by EnvoyConfig for a policy without a servable rule.
var ErrNoFleetRule = errors.New("rlqs: the policy has no fleet rule the rate_limit_quota filter can enforce")

// MinReportingInterval is the shortest reporting_interval Envoy accepts (more
// than 100 ms).
const MinReportingInterval = 100 * time.Millisecond

// EnvoyConfig returns an Envoy bootstrap, as YAML, whose listener runs every
// request through envoy.filters.http.rate_limit_quota with one bucket matcher per
// fleet rule of p, in policy order, and the gRPC cluster "sluice_rlqs" to the
// control plane. notes lists what the configuration cannot express (rules left
// out, and why), for the operator. Each rule's settings are Settings'.
func EnvoyConfig(p *rules.Policy, o ConfigOptions) (doc []byte, notes []string, err error) {
	if o.Env == "" {
		o.Env = "default"
	}
	if o.ReportingInterval == 0 {
		o.ReportingInterval = time.Second
	}
	if o.ControlPlane == "" {
		o.ControlPlane = "127.0.0.1:8081"
	}
	if o.Upstream == "" {
		o.Upstream = "127.0.0.1:8000"
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:10000"
	}
	if o.ReportingInterval <= MinReportingInterval {
		return nil, nil, errors.New("rlqs: the reporting interval must be more than 100ms")
	}
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	var list []*xdsmatcherv3.Matcher_MatcherList_FieldMatcher
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Descriptor != nil && !r.Descriptor.HTTP {
			notes = append(notes, "rule "+r.ID+": a descriptor rule; Envoy's ratelimit filter asks for it (sluicectl envoy-config rls)")
			continue
		}
		if !r.IsFleet() {
			notes = append(notes, "rule "+r.ID+": not fleet-scoped; the rate_limit_quota filter enforces fleet rules only (load the Wasm filter for per-Envoy limits)")
			continue
		}
		s, err := Settings(p, r, o.ReportingInterval)
		if err != nil {
			notes = append(notes, err.Error())
			continue
		}
		pred, err := predicate(&r.Match)
		if err != nil {
			notes = append(notes, "rule "+r.ID+": "+err.Error())
			continue
		}
		list = append(list, &xdsmatcherv3.Matcher_MatcherList_FieldMatcher{Predicate: pred,
			OnMatch: &xdsmatcherv3.Matcher_OnMatch{OnMatch: &xdsmatcherv3.Matcher_OnMatch_Action{Action: &xdscorev3.TypedExtensionConfig{
				Name: "sluice." + r.ID, TypedConfig: envoyboot.MustAny(s)}}}})
	}
	if len(list) == 0 {
		return nil, notes, ErrNoFleetRule
	}
	if len(list) > 1 {
		notes = append(notes, "Envoy's filter counts a request against the first bucket matcher that matches: a request matching several fleet rules counts against the first of them only (the Wasm filter counts it against each)")
	}
	filter := &rlqsfilterv3.RateLimitQuotaFilterConfig{
		RlqsServer:     grpcService(o.Token),
		Domain:         o.Env,
		BucketMatchers: &xdsmatcherv3.Matcher{MatcherType: &xdsmatcherv3.Matcher_MatcherList_{MatcherList: &xdsmatcherv3.Matcher_MatcherList{Matchers: list}}},
	}
	b, err := envoyboot.Bootstrap(envoyboot.Options{Node: "sluice-rlqs", Listen: o.Listen, Upstream: o.Upstream, Admin: o.Admin,
		ControlPlaneCluster: "sluice_rlqs", ControlPlane: o.ControlPlane,
		Filter: &hcmv3.HttpFilter{Name: "envoy.filters.http.rate_limit_quota", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: envoyboot.MustAny(filter)}}})
	if err != nil {
		return nil, notes, err
	}
	if o.Token == "" {
		notes = append(notes, "no quota token ($SLUICE_QUOTA_TOKEN was unset): the stream carries no authorization metadata, "+
			"so a control plane that has a quota token refuses it (UNAUTHENTICATED) and every bucket stays on its no_assignment_behavior; "+
			"generate this file with $SLUICE_QUOTA_TOKEN set, or give Envoy a client certificate for a control plane with --client-ca-file")
	}
	head := "# Envoy with its native rate_limit_quota filter, served by the sluice control plane\n" +
		"# (RLQS over gRPC), generated from policy " + strconv.Quote(p.Name) + " by\n" +
		"#   sluicectl envoy-config rlqs --policy " + p.Name + "\n" +
		"# Each fleet rule is a bucket matcher; its bucket ids name the policy, the rule and\n" +
		"# the rule's key parts, so these Envoys spend the same budget as Envoys running the\n" +
		"# sluice Wasm filter. See docs/rlqs.md.\n"
	doc, err = envoyboot.Document(b, head, notes)
	return doc, notes, err
}

// Settings returns the bucket settings of fleet rule r of policy p: a bucket id of
// "policy", "rule" and one entry per key part, read from the request as the Wasm
// filter reads it; reporting_interval; r's rejection status; and the behaviours
// without an assignment from r's on_quota_failure: "deny" denies the requests of a
// bucket the server has not answered yet, "pass" and "local" admit them (the server
// then charges them to the budget); an expired assignment denies for
// ExpiredDenyFor before that applies. The error names the rule and what cannot be
// expressed.
func Settings(p *rules.Policy, r *rules.Rule, interval time.Duration) (*rlqsfilterv3.RateLimitQuotaBucketSettings, error) {
	fail := func(msg string) error { return errors.New("rule " + r.ID + ": " + msg) }
	if r.CostHeader != "" || r.Cost > 1 {
		return nil, fail("a request costs more than one unit; Envoy's filter spends one token per request")
	}
	if ml := maxLease(r); ml > 0 && ml < time.Second+DefaultMargin {
		return nil, fail("its leases last " + ml.String() + "; Envoy takes assignment TTLs in whole seconds, so none could be granted (use a longer window, fewer slots, or a larger burst)")
	}
	ids := map[string]*rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder{
		EntryPolicy: str(p.Name), EntryRule: str(r.ID),
	}
	for _, part := range r.Key {
		if strings.Contains(part, "|") {
			return nil, fail("key part " + strconv.Quote(part) + " has alternatives, which a bucket id cannot express")
		}
		var in proto.Message
		switch {
		case part == "user" || part == "tenant":
			h := p.Identity.UserHeader
			if part == "tenant" {
				h = p.Identity.TenantHeader
			}
			in = &matcherv3.HttpRequestHeaderMatchInput{HeaderName: h}
		case part == "client_ip":
			in = &networkinputsv3.SourceIPInput{}
		case part == "method":
			in = &matcherv3.HttpRequestHeaderMatchInput{HeaderName: ":method"}
		case part == "path":
			in = &matcherv3.HttpRequestHeaderMatchInput{HeaderName: ":path"}
		case part == "route":
			continue // the rule's own value: the server fills it in
		case strings.HasPrefix(part, "header:"):
			in = &matcherv3.HttpRequestHeaderMatchInput{HeaderName: strings.TrimPrefix(part, "header:")}
		default:
			return nil, fail("unknown key part " + strconv.Quote(part))
		}
		ids[part] = &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder{ValueSpecifier: &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_CustomValue{
			CustomValue: &corev3.TypedExtensionConfig{Name: part, TypedConfig: envoyboot.MustAny(in)}}}
	}
	noAssign, status := typev3.RateLimitStrategy_ALLOW_ALL, r.Status
	if r.QuotaFailure() == rules.QuotaFailureDeny {
		noAssign = typev3.RateLimitStrategy_DENY_ALL
	}
	if status == 0 {
		status = 429
	}
	return &rlqsfilterv3.RateLimitQuotaBucketSettings{
		BucketIdBuilder:      &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder{BucketIdBuilder: ids},
		ReportingInterval:    durationpb.New(interval),
		DenyResponseSettings: &rlqsfilterv3.RateLimitQuotaBucketSettings_DenyResponseSettings{HttpStatus: &typev3.HttpStatus{Code: typev3.StatusCode(status)}},
		NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: blanketRule(noAssign)}},
		ExpiredAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(ExpiredDenyFor(interval)),
			ExpiredAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{
				FallbackRateLimit: blanketRule(typev3.RateLimitStrategy_DENY_ALL)}},
	}, nil
}

// EnvoyReportInterval is how often Envoy's rate_limit_quota filter reports every
// bucket: 5 s, hard-coded in source/extensions/filters/http/rate_limit_quota/
// filter_persistence.cc (reporting_interval(5000), with a TODO to honour each
// bucket's reporting_interval, which it ignores today).
const EnvoyReportInterval = 5 * time.Second

// ExpiredDenyFor is how long an Envoy denies a bucket whose assignment expired
// before it falls back to no_assignment_behavior: 3 report intervals, of the
// configured reporting_interval or of the 5 s Envoy really reports at, whichever is
// longer, in whole seconds (Envoy reads only the seconds). An assignment normally
// expires only between a window's end and the next answer, which can be a report
// interval away; past this, the server is taken to be unreachable.
func ExpiredDenyFor(interval time.Duration) time.Duration {
	return (3*max(interval, EnvoyReportInterval) + time.Second - 1).Truncate(time.Second)
}

// Warnings names the fleet rules of p that Envoy's rate_limit_quota filter is
// served poorly: a fixed window (or time-wheel slot) shorter than one of its
// report intervals (EnvoyReportInterval). The server grants such a window from
// demand an Envoy reported up to an interval earlier, its follow-ups push each
// window's assignment, and Envoy's whole-second TTLs end each one up to a second
// early: some windows admit less than the limit (docs/rlqs.md, "Between
// reports"). One sentence per rule; none when no rule is concerned.
func Warnings(p *rules.Policy) []string {
	var out []string
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.IsFleet() || r.Descriptor != nil && !r.Descriptor.HTTP {
			continue
		}
		if ml := maxLease(r); ml > 0 && ml < EnvoyReportInterval {
			what := "fixed window"
			if r.Algorithm == "time_wheel" {
				what = "time-wheel slot"
			}
			out = append(out, "rule "+r.ID+": its "+what+" of "+ml.String()+" is shorter than the report interval of Envoy's rate_limit_quota filter ("+
				EnvoyReportInterval.String()+"): an Envoy of that kind is granted each window from demand it reported up to "+EnvoyReportInterval.String()+
				" earlier, and some windows admit less than the limit; give rules served to it a window of "+EnvoyReportInterval.String()+" or more")
		}
	}
	return out
}

// maxLease is FleetRule.MaxLease from the rule alone, 0 when unknown.
func maxLease(r *rules.Rule) time.Duration {
	switch r.Algorithm {
	case "fixed_window":
		if r.Window == 0 {
			return 24 * time.Hour
		}
		return r.Window
	case "time_wheel":
		slots := time.Duration(r.Slots)
		if slots == 0 {
			slots = 10
		}
		return r.Window / slots
	}
	return 0 // the buckets: checked by the server (it depends on the burst)
}

func blanketRule(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func str(s string) *rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder {
	return &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder{ValueSpecifier: &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_StringValue{StringValue: s}}
}

// predicate is the rule's match as an xDS matcher predicate on the request
// headers: the path from ":path" (which carries the query: an exact path is
// matched with an optional "?…" after it), methods from ":method", header
// conditions as they are. A rule matching everything matches any ":path".
func predicate(m *rules.Match) (*xdsmatcherv3.Matcher_MatcherList_Predicate, error) {
	var ps []*xdsmatcherv3.Matcher_MatcherList_Predicate
	switch {
	case m.PathPrefix != "":
		ps = append(ps, header(":path", &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_Prefix{Prefix: m.PathPrefix}}))
	case m.Path != "":
		ps = append(ps, header(":path", regex("^"+regexp.QuoteMeta(m.Path)+`([?#].*)?$`)))
	}
	if len(m.Methods) > 0 {
		var or []*xdsmatcherv3.Matcher_MatcherList_Predicate
		for _, meth := range m.Methods {
			or = append(or, header(":method", &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_Exact{Exact: meth}}))
		}
		ps = append(ps, join(or, false))
	}
	for _, h := range m.Headers {
		switch {
		case h.Exact != "":
			ps = append(ps, header(h.Name, &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_Exact{Exact: h.Exact}}))
		case h.Prefix != "":
			ps = append(ps, header(h.Name, &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_Prefix{Prefix: h.Prefix}}))
		case h.Present:
			ps = append(ps, header(h.Name, regex("(?s).*")))
		case h.Absent:
			ps = append(ps, &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_NotMatcher{
				NotMatcher: header(h.Name, regex("(?s).*"))}})
		default:
			return nil, errors.New("header condition on " + strconv.Quote(h.Name) + " has no test")
		}
	}
	if len(ps) == 0 {
		ps = append(ps, header(":path", regex("(?s).*")))
	}
	return join(ps, true), nil
}

func regex(re string) *xdsmatcherv3.StringMatcher {
	return &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_SafeRegex{SafeRegex: &xdsmatcherv3.RegexMatcher{
		EngineType: &xdsmatcherv3.RegexMatcher_GoogleRe2{GoogleRe2: &xdsmatcherv3.RegexMatcher_GoogleRE2{}}, Regex: re}}}
}

func header(name string, sm *xdsmatcherv3.StringMatcher) *xdsmatcherv3.Matcher_MatcherList_Predicate {
	return &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_{
		SinglePredicate: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{
			Input:   &xdscorev3.TypedExtensionConfig{Name: "header " + name, TypedConfig: envoyboot.MustAny(&matcherv3.HttpRequestHeaderMatchInput{HeaderName: name})},
			Matcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_ValueMatch{ValueMatch: sm},
		}}}
}

// join combines predicates with and (or with or); one stays as it is.
func join(ps []*xdsmatcherv3.Matcher_MatcherList_Predicate, and bool) *xdsmatcherv3.Matcher_MatcherList_Predicate {
	if len(ps) == 1 {
		return ps[0]
	}
	l := &xdsmatcherv3.Matcher_MatcherList_Predicate_PredicateList{Predicate: ps}
	if and {
		return &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_AndMatcher{AndMatcher: l}}
	}
	return &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_OrMatcher{OrMatcher: l}}
}

func grpcService(token string) *corev3.GrpcService {
	g := &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sluice_rlqs"}}}
	if token != "" {
		g.InitialMetadata = []*corev3.HeaderValue{{Key: "authorization", Value: "Bearer " + token}}
	}
	return g
}
