package rls

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	filev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/controlplane/internal/envoyboot"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// ConfigOptions shape the Envoy configuration EnvoyConfig generates.
type ConfigOptions struct {
	// Domain is the ratelimit filter's domain; "" is the policy's only one.
	Domain string
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
	// Timeout is the filter's timeout of a call (default 100 ms; Envoy's own
	// default is 20 ms).
	Timeout time.Duration
}

// ErrNoDescriptorRule is returned by EnvoyConfig for a policy without a
// descriptor rule of the domain.
var ErrNoDescriptorRule = errors.New("rls: the policy has no descriptor rule for Envoy's ratelimit filter")

// EnvoyConfig returns an Envoy bootstrap, as YAML, whose listener runs every
// request through envoy.filters.http.ratelimit against the control plane's
// RateLimitService (the gRPC cluster "sluice_rls"), failing open
// (failure_mode_deny false) and writing the draft-03 X-RateLimit headers, with
// one route rate_limits entry per descriptor rule of the domain: its actions
// produce the rule's entries (Actions). A JSON access log on standard output
// records each request's status and rate-limit headers. notes lists what the
// operator should know: each entry read from a request header, rules left out.
func EnvoyConfig(p *rules.Policy, o ConfigOptions) (doc []byte, notes []string, err error) {
	if o.ControlPlane == "" {
		o.ControlPlane = "127.0.0.1:8081"
	}
	if o.Upstream == "" {
		o.Upstream = "127.0.0.1:8000"
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:10000"
	}
	if o.Timeout <= 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	var domains []string
	for i := range p.Rules {
		if ds := p.Rules[i].Descriptor; ds != nil && !slices.Contains(domains, ds.Domain) {
			domains = append(domains, ds.Domain)
		}
	}
	switch {
	case len(domains) == 0:
		return nil, nil, ErrNoDescriptorRule
	case o.Domain == "" && len(domains) > 1:
		return nil, nil, errors.New("rls: the policy's descriptor rules have the domains " + strings.Join(domains, ", ") + ": choose one (--domain); an Envoy's ratelimit filter has one")
	case o.Domain == "":
		o.Domain = domains[0]
	}
	var limits []*routev3.RateLimit
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Descriptor == nil || r.Descriptor.Domain != o.Domain || r.Descriptor.Unlimited {
			continue // an unlimited rule's descriptors are those a less specific rule's actions send
		}
		actions, from := Actions(&p.Identity, r.Descriptor)
		if actions == nil {
			notes = append(notes, "rule "+r.ID+": "+from)
			continue
		}
		if where := elsewhere(r.Descriptor); where != "" {
			// Its actions produce the descriptor only on another route or
			// Envoy: on this one's route they would send what never matches.
			notes = append(notes, "rule "+r.ID+": "+where)
			continue
		}
		if from != "" {
			notes = append(notes, "rule "+r.ID+": "+from)
		}
		limits = append(limits, &routev3.RateLimit{Actions: actions})
	}
	if len(limits) == 0 {
		return nil, notes, ErrNoDescriptorRule
	}
	filter := &ratelimitv3.RateLimit{
		Domain:                  o.Domain,
		Timeout:                 durationpb.New(o.Timeout),
		FailureModeDeny:         false,
		EnableXRatelimitHeaders: ratelimitv3.RateLimit_DRAFT_VERSION_03,
		RateLimitService: &ratelimitconfv3.RateLimitServiceConfig{
			GrpcService:         &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sluice_rls"}}},
			TransportApiVersion: corev3.ApiVersion_V3,
		},
	}
	if o.Token != "" {
		filter.RateLimitService.GrpcService.InitialMetadata = []*corev3.HeaderValue{{Key: "authorization", Value: "Bearer " + o.Token}}
	}
	b, err := envoyboot.Bootstrap(envoyboot.Options{Node: "sluice-rls", Listen: o.Listen, Upstream: o.Upstream, Admin: o.Admin,
		ControlPlaneCluster: "sluice_rls", ControlPlane: o.ControlPlane,
		Filter:     &hcmv3.HttpFilter{Name: "envoy.filters.http.ratelimit", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: envoyboot.MustAny(filter)}},
		RateLimits: limits, AccessLog: []*accesslogv3.AccessLog{accessLog()}})
	if err != nil {
		return nil, notes, err
	}
	if o.Token == "" {
		notes = append(notes, "no quota token ($SLUICE_QUOTA_TOKEN was unset): the calls carry no authorization metadata, "+
			"so a control plane that has a quota token refuses them (UNAUTHENTICATED) and, failing open, Envoy admits every request; "+
			"generate this file with $SLUICE_QUOTA_TOKEN set, or give Envoy a client certificate for a control plane with --client-ca-file")
	}
	head := "# Envoy with its ratelimit filter, served by the sluice control plane's RateLimitService\n" +
		"# (gRPC), generated from policy " + strconv.Quote(p.Name) + " by\n" +
		"#   sluicectl envoy-config rls --policy " + p.Name + "\n" +
		"# Each descriptor rule of domain " + strconv.Quote(o.Domain) + " is a route rate_limits entry whose\n" +
		"# actions produce its descriptor. See docs/rls.md.\n"
	doc, err = envoyboot.Document(b, head, notes)
	return doc, notes, err
}

// Actions returns the route rate_limit actions that produce descriptor ds's
// entries, in order, as Envoy's actions name them (route_components.proto,
// RateLimit.Action): "remote_address", "source_cluster" and
// "destination_cluster" (without a key_part, or remote_address's client_ip)
// are those actions, an exact value included (the action sends the request's
// address or cluster, which the value matches or not); any other exact value
// is a generic_key with the entry's key; an entry of an HTTP descriptor rule
// reads what its key_part reads (its header, the identity's user or tenant
// header, :method, :path); any other key is read from the request header of
// that name.
// from says where the request values come from, "" when none does; with nil
// actions it says why none can be made.
func Actions(id *rules.Identity, ds *rules.Descriptor) (actions []*routev3.RateLimit_Action, from string) {
	var headers []string
	header := func(name, key string) *routev3.RateLimit_Action {
		headers = append(headers, name)
		return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RequestHeaders_{RequestHeaders: &routev3.RateLimit_Action_RequestHeaders{
			HeaderName: name, DescriptorKey: key}}}
	}
	for _, e := range ds.Entries {
		var a *routev3.RateLimit_Action
		switch {
		case e.Key == "remote_address" && (e.KeyPart == "" || e.KeyPart == "client_ip"):
			// Before an exact value: the action sends the request's own
			// address, which an exact value then matches or not.
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RemoteAddress_{RemoteAddress: &routev3.RateLimit_Action_RemoteAddress{}}}
		case e.KeyPart == "" && e.Key == "source_cluster":
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_SourceCluster_{SourceCluster: &routev3.RateLimit_Action_SourceCluster{}}}
		case e.KeyPart == "" && e.Key == "destination_cluster":
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_DestinationCluster_{DestinationCluster: &routev3.RateLimit_Action_DestinationCluster{}}}
		case e.Exact():
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{GenericKey: &routev3.RateLimit_Action_GenericKey{
				DescriptorKey: e.Key, DescriptorValue: e.Value}}}
		case e.KeyPart == "user" && id.UserHeader != "":
			a = header(id.UserHeader, e.Key)
		case e.KeyPart == "tenant" && id.TenantHeader != "":
			a = header(id.TenantHeader, e.Key)
		case e.KeyPart == "method":
			a = header(":method", e.Key)
		case e.KeyPart == "path":
			a = header(":path", e.Key)
		case strings.HasPrefix(e.KeyPart, "header:"):
			a = header(strings.TrimPrefix(e.KeyPart, "header:"), e.Key)
		case e.KeyPart == "" && rules.ValidHeaderName(strings.ToLower(e.Key)):
			a = header(strings.ToLower(e.Key), e.Key)
		default:
			what := "entry " + strconv.Quote(e.Key)
			if e.KeyPart != "" {
				what += " (key_part " + e.KeyPart + ")"
			}
			return nil, what + " has no action that produces it; write its route action by hand (docs/rls.md)"
		}
		actions = append(actions, a)
	}
	if len(headers) > 0 {
		from = "entries read from the request headers " + strings.Join(headers, ", ") + " (a request without one sends no descriptor for the rule); change the actions if your descriptors come from elsewhere"
	}
	return actions, from
}

// The names the bootstrap gives its one route's cluster and its node's
// cluster (envoyboot.Bootstrap): what destination_cluster and source_cluster
// send from it.
const (
	bootstrapUpstream = "upstream"
	bootstrapNode     = "sluice-rls"
)

// elsewhere says where a rule's rate_limits entry belongs when this
// bootstrap's route cannot produce its descriptor: an exact destination_cluster
// other than the route's cluster (the entry goes on the route to that
// cluster), an exact source_cluster other than this Envoy's; "" when it can.
func elsewhere(ds *rules.Descriptor) string {
	for _, e := range ds.Entries {
		switch {
		case e.KeyPart != "" || !e.Exact():
		case e.Key == "destination_cluster" && e.Value != bootstrapUpstream:
			return "destination_cluster " + strconv.Quote(e.Value) + " is the cluster of the route a request takes, and this bootstrap's one route goes to cluster " +
				strconv.Quote(bootstrapUpstream) + ": add the entry to the rate_limits of the route to cluster " + strconv.Quote(e.Value) +
				" (actions: [{destination_cluster: {}}] for this entry; docs/rls.md)"
		case e.Key == "source_cluster" && e.Value != bootstrapNode:
			return "source_cluster " + strconv.Quote(e.Value) + " is the sending Envoy's own cluster (--service-cluster), and this one's is " +
				strconv.Quote(bootstrapNode) + ": add the entry to the routes of the Envoys of cluster " + strconv.Quote(e.Value) +
				" (actions: [{source_cluster: {}}] for this entry; docs/rls.md)"
		}
	}
	return ""
}

// accessLog is the bootstrap's JSON access log on standard output.
func accessLog() *accesslogv3.AccessLog {
	f := func(s string) *structpb.Value { return structpb.NewStringValue(s) }
	format := &structpb.Struct{Fields: map[string]*structpb.Value{
		"timestamp":             f("%START_TIME%"),
		"method":                f("%REQ(:METHOD)%"),
		"path":                  f("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
		"status":                f("%RESPONSE_CODE%"),
		"duration":              f("%DURATION%"),
		"flags":                 f("%RESPONSE_FLAGS%"),
		"x_ratelimit_limit":     f("%RESP(X-RATELIMIT-LIMIT)%"),
		"x_ratelimit_remaining": f("%RESP(X-RATELIMIT-REMAINING)%"),
		"x_ratelimit_reset":     f("%RESP(X-RATELIMIT-RESET)%"),
	}}
	fal := &filev3.FileAccessLog{Path: "/dev/stdout", AccessLogFormat: &filev3.FileAccessLog_LogFormat{LogFormat: &corev3.SubstitutionFormatString{
		Format: &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: format}}}}
	return &accesslogv3.AccessLog{Name: "envoy.access_loggers.file", ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: envoyboot.MustAny(fal)}}
}
