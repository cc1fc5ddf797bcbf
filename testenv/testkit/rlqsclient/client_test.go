package rlqsclient

import (
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func tb(max, perFill uint32, sec int64, nanos int32) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: &durationpb.Duration{Seconds: sec, Nanos: nanos}}}}
}

func settings(noAssign, expired typev3.RateLimitStrategy_BlanketRule, timeout int64) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	return &rlqsfilterv3.RateLimitQuotaBucketSettings{
		ReportingInterval: durationpb.New(time.Second),
		NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: blanket(noAssign)}},
		ExpiredAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(time.Duration(timeout) * time.Second),
			ExpiredAssignmentBehavior:        &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: blanket(expired)}},
	}
}

var id = map[string]string{"policy": "p", "rule": "r", "user": "u"}

func assign(s *typev3.RateLimitStrategy, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse {
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s}}}}}
}

func count(c *Client, n int) (allowed int) {
	for range n {
		if c.Decide(id) {
			allowed++
		}
	}
	return allowed
}

func TestFirstRequestFollowsNoAssignmentBehaviour(t *testing.T) {
	for _, tc := range []struct {
		rule typev3.RateLimitStrategy_BlanketRule
		want bool
	}{{typev3.RateLimitStrategy_ALLOW_ALL, true}, {typev3.RateLimitStrategy_DENY_ALL, false}} {
		c := New(nil, NewFakeClock(time.Hour), Config{Settings: settings(tc.rule, typev3.RateLimitStrategy_DENY_ALL, 5)})
		if got := c.Decide(id); got != tc.want {
			t.Errorf("%v: first request allowed %t", tc.rule, got)
		}
		if got := c.Decide(id); got != tc.want {
			t.Errorf("%v: second request (no assignment yet) allowed %t", tc.rule, got)
		}
		if s := c.Stats(); s.ReportsDropped != 1 {
			t.Errorf("the immediate report without a stream: %+v, want 1 dropped", s)
		}
		c.Close()
	}
}

func TestTokenBucketIsReplacedOnlyWhenItsConfigurationDiffers(t *testing.T) {
	clk := NewFakeClock(time.Hour)
	c := New(nil, clk, Config{Settings: settings(typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL, 5)})
	defer c.Close()
	c.Decide(id)
	c.Apply(assign(tb(10, 10, 60, 1), 5*time.Second))
	if got := count(c, 20); got != 10 {
		t.Fatalf("a fresh bucket of 10: %d allowed", got)
	}
	// The same configuration (fill_interval's seconds differ, which Envoy does not
	// compare): the spent bucket is carried over.
	c.Apply(assign(tb(10, 10, 61, 1), 5*time.Second))
	if got := count(c, 20); got != 0 {
		t.Errorf("a carried-over spent bucket allowed %d", got)
	}
	// Another nanos: a fresh bucket, but as full as the spent one it replaces.
	c.Apply(assign(tb(10, 10, 60, 2), 5*time.Second))
	if got := count(c, 20); got != 0 {
		t.Errorf("another nanos after a spent bucket: %d allowed, want an empty bucket", got)
	}
	// A blanket rule drops the token bucket: the next one starts full.
	c.Apply(assign(blanket(typev3.RateLimitStrategy_DENY_ALL), 5*time.Second))
	c.Apply(assign(tb(10, 10, 60, 3), 5*time.Second))
	if got := count(c, 20); got != 10 {
		t.Errorf("a fresh bucket after a blanket rule: %d allowed, want 10", got)
	}
	if s := c.Stats(); s.Replaced != 3 || s.CarriedOver != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestAFreshTokenBucketStartsAsFullAsTheOneItReplaces: Envoy starts a replacing
// token bucket with the share of its max_tokens the old one still held
// (envoyproxy/envoy#37624), rounded down to whole tokens.
func TestAFreshTokenBucketStartsAsFullAsTheOneItReplaces(t *testing.T) {
	clk := NewFakeClock(time.Hour)
	c := New(nil, clk, Config{Settings: settings(typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL, 5)})
	defer c.Close()
	c.Decide(id)
	c.Apply(assign(tb(10, 10, 600, 1), 5*time.Second))
	if got := count(c, 3); got != 3 {
		t.Fatalf("a fresh bucket of 10: %d of 3 allowed", got)
	}
	// 7 of 10 left: a bucket of 20 starts with 14, one of 5 with 3 (3.5 rounded down).
	c.Apply(assign(tb(20, 20, 600, 2), 5*time.Second))
	if got := count(c, 30); got != 14 {
		t.Errorf("20 replacing 7 of 10: %d allowed, want 14", got)
	}
	c.Apply(assign(blanket(typev3.RateLimitStrategy_DENY_ALL), 5*time.Second))
	c.Apply(assign(tb(10, 10, 600, 3), 5*time.Second))
	count(c, 3)
	c.Apply(assign(tb(5, 5, 600, 4), 5*time.Second))
	if got := count(c, 30); got != 3 {
		t.Errorf("5 replacing 7 of 10: %d allowed, want 3", got)
	}
}

func TestAssignmentExpiresToFallbackThenToNoAssignment(t *testing.T) {
	clk := NewFakeClock(time.Hour)
	c := New(nil, clk, Config{Settings: settings(typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL, 3)})
	defer c.Close()
	c.Decide(id)
	// A TTL of 2.9 s is 2 whole seconds to Envoy.
	c.Apply(assign(tb(1000, 1000, 60, 1), 2900*time.Millisecond))
	clk.Advance(1999 * time.Millisecond)
	if !c.Decide(id) {
		t.Fatal("denied while the assignment lives")
	}
	clk.Advance(time.Millisecond)
	if c.Decide(id) {
		t.Fatal("allowed after the assignment expired: the fallback is DENY_ALL")
	}
	clk.Advance(3 * time.Second)
	if !c.Decide(id) {
		t.Fatal("denied after the fallback expired: no_assignment_behavior is ALLOW_ALL")
	}
	if s := c.Stats(); s.Expired != 1 || s.FallbackExpired != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestAbandonErasesTheBucket(t *testing.T) {
	clk := NewFakeClock(time.Hour)
	c := New(nil, clk, Config{Settings: settings(typev3.RateLimitStrategy_DENY_ALL, typev3.RateLimitStrategy_DENY_ALL, 3)})
	defer c.Close()
	c.Decide(id)
	c.Apply(assign(blanket(typev3.RateLimitStrategy_ALLOW_ALL), time.Minute))
	if !c.Decide(id) {
		t.Fatal("ALLOW_ALL denied")
	}
	c.Apply(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}}})
	if c.Decide(id) {
		t.Fatal("after abandon the bucket is new: its first request follows no_assignment_behavior (DENY_ALL)")
	}
}

func TestTokenBucketRefillFollowsEnvoy(t *testing.T) {
	// A sub-second fill_interval is 0 whole seconds: Envoy divides by zero, and the
	// bucket never runs dry.
	b := newTokenBucket(tb(2, 1, 0, 500000000).GetTokenBucket(), time.Hour)
	for i := range 100 {
		if !b.consume(time.Hour + time.Duration(i+1)*time.Millisecond) {
			t.Fatalf("an unlimited bucket ran dry at request %d", i)
		}
	}
	// Filling takes longer than the monotonic clock has run: it starts empty.
	b = newTokenBucket(tb(100, 100, 60, 0).GetTokenBucket(), 30*time.Second)
	if b.consume(30*time.Second + time.Millisecond) {
		t.Fatal("a bucket that takes 60 s to fill, 30 s after boot, started with tokens")
	}
	// 100 tokens per minute, from full: 100 now, then one every 0.6 s.
	b = newTokenBucket(tb(100, 100, 60, 0).GetTokenBucket(), time.Hour)
	n := 0
	for b.consume(time.Hour) {
		n++
	}
	if n != 100 {
		t.Fatalf("a full bucket of 100 gave %d", n)
	}
	if b.consume(time.Hour+590*time.Millisecond) || !b.consume(time.Hour+600*time.Millisecond) {
		t.Fatal("the refill is not one token per 0.6 s")
	}
}

// TestReportsEveryFiveSecondsWhateverReportingIntervalSays: Envoy reports every
// bucket every 5 s (filter_persistence.cc hard-codes it) and ignores the bucket
// settings' reporting_interval (here 1 s): a new bucket is reported at once, then
// with every other bucket at each 5 s tick, its counts reset as they are read.
func TestReportsEveryFiveSecondsWhateverReportingIntervalSays(t *testing.T) {
	clk := NewFakeClock(time.Hour)
	var reports []*rlqsv3.RateLimitQuotaUsageReports
	c := New(nil, clk, Config{Settings: settings(typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL, 5),
		Loopback: func(r *rlqsv3.RateLimitQuotaUsageReports) { reports = append(reports, r) }})
	defer c.Close()
	c.Decide(id) // a new bucket: reported at once
	if len(reports) != 1 {
		t.Fatalf("%d reports after the first request, want the new bucket's", len(reports))
	}
	count(c, 3)
	clk.Advance(4900 * time.Millisecond)
	if len(reports) != 1 {
		t.Fatalf("%d reports within 5 s, want none but the first (reporting_interval of 1 s ignored)", len(reports))
	}
	clk.Advance(200 * time.Millisecond)
	if len(reports) != 2 || reports[1].BucketQuotaUsages[0].NumRequestsAllowed != 3 {
		t.Fatalf("reports at 5 s: %v, want a second one counting the 3 requests", reports)
	}
	clk.Advance(5 * time.Second)
	if len(reports) != 3 || reports[2].BucketQuotaUsages[0].NumRequestsAllowed != 0 {
		t.Fatalf("reports at 10 s: %v, want a third one counting nothing (counts reset as read)", reports)
	}
}
