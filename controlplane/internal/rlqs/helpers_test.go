package rlqs

import (
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/promtest"
)

// counterWith is promtest.Counter.
func counterWith(_ testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	return promtest.Counter(reg, name, label, value)
}

func mustRequest(t *testing.T, id map[string]string) *rules.Request {
	t.Helper()
	var parts []string // the rule keys on every entry the test names
	for name := range id {
		parts = append(parts, name)
	}
	r, reason := request(id, parts)
	if reason != "" {
		t.Fatal(reason)
	}
	return &r
}

// applied is the actions of resp as Envoy applies them: a DENY_ALL followed by a token
// bucket for the same bucket (fresh's pair) is the token bucket alone.
func applied(resp *rlqsv3.RateLimitQuotaResponse) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for i, a := range resp.GetBucketAction() {
		if i+1 < len(resp.BucketAction) && a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL &&
			resp.BucketAction[i+1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil &&
			proto.Equal(a.GetBucketId(), resp.BucketAction[i+1].GetBucketId()) {
			continue
		}
		out = append(out, a)
	}
	return out
}
