package app

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// TestAPolicyServedOverTheRateLimitServiceShowsInItsStatus: Envoys using
// their ratelimit filter never poll a policy, so its status says what this
// replica's RateLimitService decided under it (how many descriptors, when the
// last), and nothing before the first decision.
func TestAPolicyServedOverTheRateLimitServiceShowsInItsStatus(t *testing.T) {
	grpcAddr := freeAddr(t)
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_QUOTA_TOKEN": "quota-token", "SLUICE_DATA_DIR": t.TempDir()}
	c, _ := server(t, []string{"--grpc-listen", grpcAddr}, env)
	if r := c.Do("PUT", "/v1/policies/edge", []byte(`{"policy":"edge","rules":[{"id":"per-user","descriptor":{"domain":"edge","entries":[{"key":"user"}]},`+
		`"algorithm":"fixed_window","limit":5,"window":"1m","scope":"fleet"}]}`)); r.Status != 201 {
		t.Fatalf("PUT → %d %s", r.Status, r.Body)
	}
	status := func() (out struct {
		RLS *struct {
			Decisions    int64     `json:"decisions"`
			LastDecision time.Time `json:"last_decision"`
		} `json:"rls"`
	}) {
		r := c.Do("GET", "/v1/policies/edge/status", nil)
		if err := json.Unmarshal(r.Body, &out); err != nil || r.Status != 200 {
			t.Fatalf("status → %d %s", r.Status, r.Body)
		}
		return out
	}
	if st := status(); st.RLS != nil {
		t.Fatalf("rls before any decision: %+v", st.RLS)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer quota-token"), 10*time.Second)
	defer cancel()
	before := time.Now()
	for range 3 {
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit: %v %v", resp, err)
		}
	}
	if st := status(); st.RLS == nil || st.RLS.Decisions != 3 || st.RLS.LastDecision.Before(before.Add(-time.Second)) {
		t.Fatalf("rls after 3 decisions: %+v", st.RLS)
	}
}
