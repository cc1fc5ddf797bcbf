package rlqs

import (
	"context"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzReport: whatever a stream sends that decodes as a usage report, the server
// answers without panicking, and every answer passes its type's validation.
func FuzzReport(f *testing.F) {
	for _, r := range []*rlqsv3.RateLimitQuotaUsageReports{
		report(simEnv, 1, 0, map[string]string{"policy": "p", "rule": "fw", "user": "u"}),
		report(simEnv, 5, 9, map[string]string{"policy": "p", "rule": "tb", "user": "u"}, map[string]string{"policy": "p", "rule": "pass", "user": "vip"}),
		report("x", 0, 0, map[string]string{"policy": "p", "rule": "fw", "client_ip": "::ffff:1.2.3.4", "header:x-a": "b"}),
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	fx := newFixture(f)
	ss := fx.srv.newStream("")
	f.Fuzz(func(t *testing.T, b []byte) {
		var r rlqsv3.RateLimitQuotaUsageReports
		if proto.Unmarshal(b, &r) != nil || r.Domain == "" {
			return // gRPC refuses what does not decode; an empty domain ends the stream
		}
		resp, after := ss.handle(context.Background(), &r)
		for _, fn := range after {
			fn(fx.now)
		}
		if len(resp.BucketAction) == 0 {
			return // nothing is sent
		}
		if err := resp.ValidateAll(); err != nil {
			t.Fatalf("invalid answer %v to %v: %v", resp, &r, err)
		}
		fx.now += 1e8
	})
}
