package app

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlqs"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// dialRLQS connects to the plane's gRPC listener over TLS, presenting cert if not nil.
func (p *tlsPlane) dialRLQS(t *testing.T, addr string, cert *testpki.Cert) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.ca.Pool()}
	if cert != nil {
		c := cert.TLS(t)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestRLQSOverMTLSSpendsTheFleetBudget: an Envoy of the rate_limit_quota kind,
// authenticated by its certificate, gets token buckets from the same budget the
// quota endpoint leases from; the two together never exceed the limit; a stream
// without a certificate is refused; gRPC health answers SERVING.
func TestRLQSOverMTLSSpendsTheFleetBudget(t *testing.T) {
	gaddr := freeAddr(t)
	p := startTLSPlane(t, tightFW, "--grpc-listen", gaddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// No client certificate: UNAUTHENTICATED, and nothing is decided.
	anon := p.dialRLQS(t, gaddr, nil)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(anon).StreamRateLimitQuotas(ctx)
	if err == nil {
		_ = st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "default"})
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a stream without a client certificate: %v, want Unauthenticated", err)
	}
	h, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{Service: rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}

	pol, err := rules.ParsePolicy([]byte(tightFW))
	if err != nil {
		t.Fatal(err)
	}
	settings, err := rlqs.Settings(pol, &pol.Rules[0], 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	leaf := p.ca.Issue(t, testpki.Leaf{CommonName: "envoy", URIs: []string{idA}})
	c := rlqsclient.New(p.dialRLQS(t, gaddr, &leaf), rlqsclient.NewRealClock(time.Hour), rlqsclient.Config{Domain: "default", Settings: settings, StartTimeout: 5 * time.Second})
	defer c.Close()
	id := map[string]string{"policy": "p", "rule": "fw"}
	admitted := 0
	if c.Decide(id) {
		admitted++
	}
	for c.Stats().Replaced == 0 { // the first token bucket
		if ctx.Err() != nil {
			t.Fatalf("no assignment arrived: %+v", c.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The quota endpoint's Envoy takes what it can of the rest.
	wasm := p.envoy(t, idB)
	leased := uint64(0)
	for {
		code, k, _ := ask(t, wasm, p.url, "wasm-0", 300, 0, 0)
		if code != 200 {
			t.Fatalf("quota endpoint → %d", code)
		}
		if k.Granted == 0 {
			break
		}
		leased += k.Granted
	}
	for range 400 {
		if c.Decide(id) {
			admitted++
		}
	}
	if admitted+int(leased) > 300 {
		t.Fatalf("RLQS admitted %d and the quota endpoint leased %d: %d > the limit 300", admitted, leased, admitted+int(leased))
	}
	if admitted < 2 {
		t.Fatalf("RLQS admitted %d: its token bucket was not used", admitted)
	}
	t.Logf("RLQS admitted %d, the quota endpoint leased %d, of 300", admitted, leased)
}

// rlqsExchange sends one usage report over a plaintext stream with the quota token:
// a bucket of rule fw of policy p and one of an unknown rule (abandoned), so that
// the RLQS metrics have series.
func rlqsExchange(t *testing.T, addr, token string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), 10*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "default"}
	for _, rule := range []string{"fw", "nope"} {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"policy": "p", "rule": rule}}, NumRequestsAllowed: 1})
	}
	_ = st.Send(r)
	resp, err := st.Recv()
	// An abandon for "nope"; for "fw" a grant: a DENY_ALL then its token bucket.
	if err != nil || len(resp.BucketAction) != 3 {
		t.Fatalf("RLQS exchange: %v %v", resp, err)
	}
}
