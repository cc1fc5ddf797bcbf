// Package rlqstest starts, for end-to-end tests, Envoys of the rate_limit_quota
// kind (package rlqsclient) configured as `sluicectl envoy-config rlqs` would
// configure a real Envoy against a running control plane.
package rlqstest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3" // types the generated bootstrap names
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
)

// Generator is how to run `sluicectl envoy-config rlqs` against a control plane.
type Generator struct {
	Sluicectl  string // the sluicectl binary
	Server     string // the control plane's HTTP address, host:port
	GRPC       string // its gRPC address, host:port
	Policy     string
	ReadToken  string
	QuotaToken string
}

// BucketSettings runs `sluicectl envoy-config rlqs` on the stored policy, with
// reporting interval iv, and returns the settings of rule's bucket matcher: what an
// Envoy configured with its output would use. It fails the test unless the
// generated filter sends the quota token as its stream's metadata.
func (g Generator) BucketSettings(t testing.TB, rule string, iv time.Duration) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	t.Helper()
	cmd := exec.Command(g.Sluicectl, "--server", "http://"+g.Server, "envoy-config", "rlqs", "--policy", g.Policy,
		"--grpc", g.GRPC, "--reporting-interval", iv.String())
	cmd.Env = append(os.Environ(), "SLUICE_READ_TOKEN="+g.ReadToken, "SLUICE_QUOTA_TOKEN="+g.QuotaToken)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl envoy-config rlqs: %v", err)
	}
	b, err := devproxy.ParseBootstrap(out)
	if err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var f rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&f); err != nil {
		t.Fatal(err)
	}
	if md := f.GetRlqsServer().GetInitialMetadata(); len(md) != 1 || md[0].GetValue() != "Bearer "+g.QuotaToken {
		t.Fatalf("the generated filter sends metadata %v, want the quota token", md)
	}
	for _, m := range f.GetBucketMatchers().GetMatcherList().GetMatchers() {
		a := m.GetOnMatch().GetAction()
		if a.GetName() != "sluice."+rule {
			continue
		}
		var s rlqsfilterv3.RateLimitQuotaBucketSettings
		if err := a.GetTypedConfig().UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	t.Fatalf("no bucket matcher for rule %s", rule)
	return nil
}

// Envoy returns an Envoy running the rate_limit_quota filter against the gRPC
// address addr, in domain policy, with the quota token as the generated
// configuration sends it; the test's cleanup closes it.
func Envoy(t testing.TB, addr, policy, quotaToken string, s *rlqsfilterv3.RateLimitQuotaBucketSettings) *rlqsclient.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	c := rlqsclient.New(conn, rlqsclient.NewRealClock(time.Hour), rlqsclient.Config{Domain: policy, Settings: s,
		Metadata: map[string]string{"authorization": "Bearer " + quotaToken}, StartTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { c.Close(); conn.Close() })
	return c
}

// Report sends one usage report over the Rate Limit Quota Service at addr
// (gRPC, with quotaToken as bearer token) for the demo policy's fleet rule
// "fleet-per-user" and user, plus one for a rule the policy lacks, and waits for
// the answer. It fails the test if the stream fails or goes unanswered within
// 10 s.
func Report(t testing.TB, addr, quotaToken, user string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+quotaToken), 10*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "default", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"policy": "default", "rule": "fleet-per-user", "user": user}}, NumRequestsAllowed: 1},
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"policy": "default", "rule": "no-such-rule"}}, NumRequestsAllowed: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("RLQS answer: %v", err)
	}
}
