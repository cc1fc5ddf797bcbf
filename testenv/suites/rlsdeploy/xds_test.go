package rlsdeploy

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// xdsNode is the node id Envoy Gateway gives the rate limit Deployment
// (CONFIG_GRPC_XDS_NODE_ID; its snapshots are keyed by it).
const xdsNode = "envoy-ratelimit"

// xdsServer is a state-of-the-world ADS server (go-control-plane's
// pkg/server/v3 on a snapshot cache) serving RateLimitConfig resources over
// mTLS, as Envoy Gateway's rate limit xDS server does. It counts the NACKs
// received. clientEnv are the variables that make a service its client.
type xdsServer struct {
	addr      string
	cache     cachev3.SnapshotCache
	n         int
	clientEnv []string

	mu    sync.Mutex
	nacks []string
}

func startXDS(t *testing.T) *xdsServer {
	t.Helper()
	ca, dir := newCA(t), t.TempDir()
	srvCert := ca.Server(t)
	cliCert, cliKey := ca.Issue(t, leaf("envoy-ratelimit.envoy-gateway-system.svc")).Write(t, dir, "client")
	x := &xdsServer{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		clientEnv: []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + cliCert,
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + cliKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + ca.WriteCA(t, dir, "ca")}}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoverygrpc.DiscoveryRequest) error {
		if d := req.GetErrorDetail(); d != nil {
			x.mu.Lock()
			x.nacks = append(x.nacks, d.GetMessage())
			x.mu.Unlock()
		}
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, x.cache, cb)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{srvCert.TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	x.addr = l.Addr().String()
	go func() { _ = g.Serve(l) }()
	t.Cleanup(func() { g.Stop(); cancel() })
	return x
}

// push makes cfgs the whole set served to xdsNode.
func (x *xdsServer) push(t *testing.T, cfgs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	x.n++
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(strconv.Itoa(x.n), map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), xdsNode, snap); err != nil {
		t.Fatal(err)
	}
}

func (x *xdsServer) nacked() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.nacks...)
}

// gatewayConfig is a RateLimitConfig as Envoy Gateway's translator writes it
// for one listener (internal/xds/translator/ratelimit.go,
// BuildRateLimitServiceConfig): named and domained by the listener, one
// descriptor per route keyed and valued by the route's name, below it one
// per rule of the route's BackendTrafficPolicy: here a rule matching every
// request (generic key rule-0-match--1) and a rule on a distinct header
// (rule-1-match-0, any value) with a limit per value.
func gatewayConfig(unit rlsconfv3.RateLimitUnit, all, perUser uint32) *rlsconfv3.RateLimitConfig {
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	return &rlsconfv3.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: route, Value: route, Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "rule-0-match--1", Value: "rule-0-match--1", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: all}},
			{Key: "rule-1-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUser}},
		}}}}
}

// gatewayLimits are the limits answered for the two descriptors Envoy
// Gateway's route actions send (the route and rule generic keys; the route
// and the header's value), with hits 0; an error is a call answered with
// one (before the first configuration: "no rate limit configuration loaded").
func gatewayLimits(d *deployment) (all, perUser uint32, err error) {
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	resp1, err := d.call("default/eg/http", 0, route, route, "rule-0-match--1", "rule-0-match--1")
	if err != nil {
		return 0, 0, err
	}
	resp2, err := d.call("default/eg/http", 0, route, route, "rule-1-match-0", "alice")
	if err != nil {
		return 0, 0, err
	}
	return resp1.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), resp2.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), nil
}

// TestRulesPushedOverXDSAreServedAndABrokenPushIsNacked runs the Deployment
// as Envoy Gateway writes it (CONFIG_TYPE=GRPC_XDS_SOTW, its node id, mTLS
// to the xDS server, FORCE_START_WITHOUT_INITIAL_CONFIG=true) against an ADS server serving
// RateLimitConfig resources shaped as Envoy Gateway's: the first push is
// served; a second is served at once; a push that does not load (a limit
// without a unit) is NACKed and the last good limits kept; the push after it
// is served.
func TestRulesPushedOverXDSAreServedAndABrokenPushIsNacked(t *testing.T) {
	for _, im := range impls {
		t.Run(strings.ReplaceAll(im.name, "/", "_"), func(t *testing.T) {
			x := startXDS(t)
			root := t.TempDir()
			d := deploy(t, im, root, nil, append(x.clientEnv, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+x.addr,
				"CONFIG_GRPC_XDS_NODE_ID="+xdsNode, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")...)
			if _, _, err := gatewayLimits(d); err == nil || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
				t.Fatalf("a call before any configuration: %v, want envoyproxy/ratelimit's error", err)
			}
			x.push(t, gatewayConfig(rlsconfv3.RateLimitUnit_HOUR, 3, 2))
			await := func(what string, all, perUser uint32) {
				t.Helper()
				start := time.Now()
				if !proctest.WaitFor(changeTimeout, func() bool {
					a, p, err := gatewayLimits(d)
					return err == nil && a == all && p == perUser
				}) {
					a, p, err := gatewayLimits(d)
					t.Fatalf("%s: limits %d and %d not served within %s (answered %d and %d, %v)", what, all, perUser, changeTimeout, a, p, err)
				}
				t.Logf("%s: %s served %s after the push", im.name, what, time.Since(start).Round(time.Millisecond))
			}
			await("the first push", 3, 2)
			x.push(t, gatewayConfig(rlsconfv3.RateLimitUnit_HOUR, 5, 4))
			await("a second push", 5, 4)

			x.push(t, gatewayConfig(rlsconfv3.RateLimitUnit_UNKNOWN, 9, 9))
			if !proctest.WaitFor(changeTimeout, func() bool { return len(x.nacked()) > 0 }) {
				t.Fatalf("a push that does not load was not NACKed within %s", changeTimeout)
			}
			t.Logf("%s NACKed: %s", im.name, x.nacked()[0])
			if a, p, err := gatewayLimits(d); err != nil || a != 5 || p != 4 {
				t.Fatalf("after a NACKed push: limits %d and %d (%v), want the last good 5 and 4", a, p, err)
			}
			x.push(t, gatewayConfig(rlsconfv3.RateLimitUnit_MINUTE, 7, 6))
			await("the push after a NACK", 7, 6)
		})
	}
}
