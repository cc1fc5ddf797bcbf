package rlqs

import (
	"context"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// TestStreamsNeedTheQuotaToken: over gRPC, a stream without the quota token is
// UNAUTHENTICATED, with another token PERMISSION_DENIED, and with it answered; a
// bucket repeated in one report is answered once.
func TestStreamsNeedTheQuotaToken(t *testing.T) {
	pol := &policies{}
	pol.set(t, simPolicy)
	q := quota.New(quota.Options{Backend: quota.NewMemory(), Policies: pol, Token: "qt"})
	g := NewGRPCServer(New(Options{Quota: q}), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(l)
	defer g.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A token bucket rule: its leases last 5 s from any moment (a fixed window's last
	// 1.25 s would be answered DENY_ALL).
	id := map[string]string{"policy": "p", "rule": "tb", "user": "u"}
	exchange := func(md ...string) (*rlqsv3.RateLimitQuotaResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			return nil, err
		}
		// A refused stream may be closed before the send: Send then says only io.EOF,
		// and Recv has the status.
		_ = st.Send(report(simEnv, 1, 0, id, id))
		return st.Recv()
	}
	if _, err := exchange(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}
	if _, err := exchange("authorization", "Bearer nope"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another token: %v, want PermissionDenied", err)
	}
	resp, err := exchange("authorization", "Bearer qt")
	if err != nil {
		t.Fatal(err)
	}
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("a bucket reported twice in one report: %v, want one token bucket", resp)
	}
}
