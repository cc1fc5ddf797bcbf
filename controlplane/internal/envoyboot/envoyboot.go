// Package envoyboot builds the Envoy bootstraps sluicectl envoy-config writes:
// one listener whose HTTP connection manager runs a rate-limit filter before the
// router to an upstream cluster, a gRPC cluster to the control plane, an admin
// endpoint on loopback, as go-control-plane's typed messages (so each is
// validated as Envoy validates it).
package envoyboot

import (
	"errors"
	"net"
	"strconv"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"
)

// MustAny packs m, a message of a linked-in type, into an Any.
func MustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // only for messages of linked-in types
	}
	return a
}

// Address is hostport ("127.0.0.1:8081") as an Envoy socket address.
func Address(hostport string) (*corev3.Address, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, errors.New("bad port in " + strconv.Quote(hostport))
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(n)}}}}, nil
}

// Cluster is a cluster of one endpoint, hostport: STATIC for an IP address,
// STRICT_DNS for a name; h2 makes it speak HTTP/2 (for gRPC).
func Cluster(name, hostport string, h2 bool) (*clusterv3.Cluster, error) {
	a, err := Address(hostport)
	if err != nil {
		return nil, err
	}
	typ := clusterv3.Cluster_STATIC
	if net.ParseIP(a.GetSocketAddress().GetAddress()) == nil {
		typ = clusterv3.Cluster_STRICT_DNS
	}
	c := &clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: typ},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: a}}}}}}}}
	if h2 {
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": MustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})}
	}
	return c, nil
}

// Options shape Bootstrap.
type Options struct {
	// Node is the node id and cluster.
	Node string
	// Listen is the listener's address and Upstream the service's, host:port.
	Listen, Upstream string
	// Admin is the admin endpoint's address, host:port (default
	// 127.0.0.1:9901, as in envoy/envoy.yaml).
	Admin string
	// ControlPlane is the gRPC cluster to the control plane: its name and
	// address, host:port.
	ControlPlaneCluster, ControlPlane string
	// Filter is the rate-limit filter, run before the router.
	Filter *hcmv3.HttpFilter
	// RateLimits are the route's rate_limits (for envoy.filters.http.ratelimit).
	RateLimits []*routev3.RateLimit
	// AccessLog, when set, is the connection manager's access log.
	AccessLog []*accesslogv3.AccessLog
}

// Bootstrap builds the bootstrap o describes.
func Bootstrap(o Options) (*bootstrapv3.Bootstrap, error) {
	listen, err := Address(o.Listen)
	if err != nil {
		return nil, err
	}
	upstream, err := Cluster("upstream", o.Upstream, false)
	if err != nil {
		return nil, err
	}
	cp, err := Cluster(o.ControlPlaneCluster, o.ControlPlane, true)
	if err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{StatPrefix: "ingress_http", UseRemoteAddress: wrapperspb.Bool(true),
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{Name: "local",
			VirtualHosts: []*routev3.VirtualHost{{Name: "upstream", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "upstream"},
					RateLimits: o.RateLimits}}}}}}}},
		HttpFilters: []*hcmv3.HttpFilter{
			o.Filter,
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: MustAny(&routerv3.Router{})}},
		},
		AccessLog: o.AccessLog}
	if o.Admin == "" {
		o.Admin = "127.0.0.1:9901"
	}
	admin, err := Address(o.Admin)
	if err != nil {
		return nil, err
	}
	return &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: o.Node, Cluster: o.Node},
		Admin: &bootstrapv3.Admin{Address: admin},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{{Name: "ingress", Address: listen, FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
				Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: MustAny(hcm)}}}}}}},
			Clusters: []*clusterv3.Cluster{upstream, cp},
		},
	}, nil
}

// Document is b as YAML (proto field names) after head, a comment of lines
// starting "# ", and one "# NOTE:" paragraph per note.
func Document(b *bootstrapv3.Bootstrap, head string, notes []string) ([]byte, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, err
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		return nil, err
	}
	for _, n := range notes {
		head += "#\n# NOTE: " + n + "\n"
	}
	return append([]byte(head), y...), nil
}
