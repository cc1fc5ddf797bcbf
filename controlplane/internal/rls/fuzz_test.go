package rls

import (
	"context"
	"log/slog"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// FuzzShouldRateLimit: whatever bytes a client sends that decode as a
// RateLimitRequest, the service answers (or refuses INVALID_ARGUMENT) without
// panicking, with one status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{desc("generic_key", "api", "user", "alice")}},
		{Domain: "edge", HitsAddend: 7, Descriptors: []*commonrl.RateLimitDescriptor{desc("path", "/v1/x"), desc("remote_address", "10.0.0.1")}},
		{Domain: "other", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "tb"}},
			Limit: &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: 2}}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	pol := &policies{}
	pol.set(f, rlsPolicy)
	clk := &clock{}
	clk.ns.Store(1 << 60)
	q := quota.New(quota.Options{Backend: quota.NewMemory(), Policies: pol, Open: true, Now: clk.now, Logger: slog.New(slog.DiscardHandler)})
	srv := New(Options{Quota: q, Policies: pol, Now: clk.now, InlineRefills: true, Logger: slog.New(slog.DiscardHandler)})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		resp, err := srv.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		clk.advance(1 << 27) // about 0.13 s a call: windows turn
	})
}
