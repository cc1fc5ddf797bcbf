package rls

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsPolicy is the shape of an envoyproxy/ratelimit configuration:
//
//	domain: edge
//	descriptors:
//	  - key: generic_key
//	    value: api
//	    rate_limit: {unit: minute, requests_per_unit: 10}
//	    descriptors:
//	      - key: user
//	        rate_limit: {unit: minute, requests_per_unit: 3}
//	  - key: remote_address
//	    rate_limit: {unit: second, requests_per_unit: 5}
//	  - key: remote_address
//	    value: 10.0.0.1
//	    rate_limit: {unit: second, requests_per_unit: 50}
//	  - key: path
//	    value: /v1/*
//	    rate_limit: {unit: hour, requests_per_unit: 7}
const rlsPolicy = `{"policy":"edge","rules":[
 {"id":"api","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"api"}]},"algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
 {"id":"api-user","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"api"},{"key":"user"}]},"algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet"},
 {"id":"per-ip","descriptor":{"domain":"edge","entries":[{"key":"remote_address"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"},
 {"id":"office","descriptor":{"domain":"edge","entries":[{"key":"remote_address","value":"10.0.0.1"}]},"algorithm":"fixed_window","limit":50,"window":"1s","scope":"fleet"},
 {"id":"v1","descriptor":{"domain":"edge","entries":[{"key":"path","value":"/v1/*"}]},"algorithm":"fixed_window","limit":7,"window":"1h","scope":"fleet"},
 {"id":"shadowed","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"shadow"}]},"algorithm":"fixed_window","limit":1,"window":"1m","scope":"fleet","shadow":true},
 {"id":"bucket","descriptor":{"domain":"other","entries":[{"key":"generic_key","value":"tb"}]},"algorithm":"token_bucket","limit":4,"window":"1s","scope":"fleet"}
]}`

func TestDescriptorsFindTheirRuleAsEnvoyproxyRatelimitWalksItsTree(t *testing.T) {
	pol := &policies{}
	pol.set(t, rlsPolicy)
	pol.set(t, `{"policy":"zz-later","rules":[
	 {"id":"dup","descriptor":{"domain":"edge","entries":[{"key":"remote_address"}]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"},
	 {"id":"deep","descriptor":{"domain":"edge","entries":[{"key":"remote_address"},{"key":"x","value":"y"}]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"}]}`)
	ix := build(1, pol.List(), slog.Default(), newMetrics(nil, func() float64 { return 0 }))
	for _, tc := range []struct {
		domain  string
		entries []entryKV
		want    string // policy/rule, "" for none
	}{
		{"edge", []entryKV{{"generic_key", "api"}}, "edge/api"},
		{"edge", []entryKV{{"generic_key", "api"}, {"user", "alice"}}, "edge/api-user"},
		{"edge", []entryKV{{"generic_key", "other"}}, ""},
		{"edge", []entryKV{{"remote_address", "10.0.0.1"}}, "edge/office"},               // the value before the key alone
		{"edge", []entryKV{{"remote_address", "10.0.0.2"}}, "edge/per-ip"},               // the key alone
		{"edge", []entryKV{{"remote_address", "10.0.0.2"}, {"x", "y"}}, "zz-later/deep"}, // a later policy's deeper rule
		{"edge", []entryKV{{"remote_address", "10.0.0.1"}, {"x", "y"}}, ""},              // no step back from the value to the key
		{"edge", []entryKV{{"path", "/v1/users"}}, "edge/v1"},
		{"edge", []entryKV{{"path", "/v2/users"}}, ""},
		{"edge", []entryKV{{"generic_key", "api"}, {"user", "a"}, {"more", "b"}}, ""}, // the rule must end at the last entry
		{"other", []entryKV{{"generic_key", "api"}}, ""},
		{"nope", []entryKV{{"generic_key", "api"}}, ""},
	} {
		got := ""
		if r := ix.lookup(tc.domain, tc.entries); r != nil {
			got = r.policy + "/" + r.rule.ID
		}
		if got != tc.want {
			t.Errorf("%s %v: rule %q, want %q", tc.domain, tc.entries, got, tc.want)
		}
	}
}

func TestAFixedWindowAdmitsItsLimitAndSaysWhatIsLeftUntilItTurns(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "")
	f.clk.advance(15 * time.Second) // 45 s before the minute ends
	for i := 0; i < 10; i++ {
		resp := r.call(t, "edge", desc("generic_key", "api"))
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i, resp)
		}
		if st.CurrentLimit.GetRequestsPerUnit() != 10 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current_limit %v, want 10 per minute", st.CurrentLimit)
		}
		if got := st.LimitRemaining; got != uint32(9-i) {
			t.Errorf("call %d: limit_remaining %d, want %d", i, got, 9-i)
		}
		if got := st.DurationUntilReset.AsDuration(); got != 45*time.Second {
			t.Errorf("duration_until_reset %v, want 45s", got)
		}
	}
	resp := r.call(t, "edge", desc("generic_key", "api"), desc("remote_address", "10.0.0.9"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("11th call: %v", resp)
	}
	// A descriptor no rule names is OK, without a limit.
	resp = r.call(t, "edge", desc("generic_key", "unknown"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown descriptor: %v", resp)
	}
	f.clk.advance(45 * time.Second)
	if resp := r.call(t, "edge", desc("generic_key", "api")); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("next window: %v", resp)
	}
}

func TestHitsAddendShadowAndNestedKeysAreHonoured(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "")
	// hits_addend: the request's, overridden by the descriptor's.
	ctx := context.Background()
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 4,
		Descriptors: []*commonrl.RateLimitDescriptor{desc("path", "/v1/a")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("4 of 7: %v %v", resp, err)
	}
	d := desc("path", "/v1/a")
	d.HitsAddend = wrapperspb.UInt64(4)
	resp, err = r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4 more of 3 left: %v %v", resp, err)
	}
	d.HitsAddend = wrapperspb.UInt64(0) // a query: nothing taken
	resp, err = r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("hits 0: %v %v", resp, err)
	}
	// Each wildcard value is a counter of its own.
	if resp := r.call(t, "edge", desc("path", "/v1/b")); resp.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("another path: %v", resp)
	}
	// Shadow: over the limit, answered OK and counted.
	for i := 0; i < 3; i++ {
		if resp := r.call(t, "edge", desc("generic_key", "shadow")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow: %v", resp)
		}
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_descriptors_total", "result", "shadow"); got != 2 {
		t.Errorf("shadow decisions %v, want 2", got)
	}
	// Nested: per user under the api key, and the users apart.
	for i := 0; i < 3; i++ {
		if resp := r.call(t, "edge", desc("generic_key", "api", "user", "alice")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("alice %d: %v", i, resp)
		}
	}
	if resp := r.call(t, "edge", desc("generic_key", "api", "user", "alice")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("alice's 4th: %v", resp)
	}
	if resp := r.call(t, "edge", desc("generic_key", "api", "user", "bob")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bob: %v", resp)
	}
}

func TestBadCallsAreRefusedWithTheirReason(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "s3cret")
	ctx := context.Background()
	for _, tc := range []struct {
		token string
		req   *rlsv3.RateLimitRequest
		code  codes.Code
	}{
		{"", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{desc("a", "b")}}, codes.Unauthenticated},
		{"wrong", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{desc("a", "b")}}, codes.PermissionDenied},
		{"s3cret", &rlsv3.RateLimitRequest{Descriptors: []*commonrl.RateLimitDescriptor{desc("a", "b")}}, codes.InvalidArgument},
		{"s3cret", &rlsv3.RateLimitRequest{Domain: "edge"}, codes.InvalidArgument},
		{"s3cret", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: make([]*commonrl.RateLimitDescriptor, MaxDescriptors+1)}, codes.InvalidArgument},
	} {
		c := ctx
		if tc.token != "" {
			c = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.token)
		}
		_, err := r.client.ShouldRateLimit(c, tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("token %q, %d descriptors: %v, want %v", tc.token, len(tc.req.Descriptors), err, tc.code)
		}
	}
	// Entries no rule can have (too many, empty) are OK.
	c := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	long := desc("a", "1", "b", "2", "c", "3", "d", "4", "e", "5", "f", "6", "g", "7", "h", "8", "i", "9")
	resp, err := r.client.ShouldRateLimit(c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{long, {}, desc("remote_address", "")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 3 {
		t.Fatalf("odd descriptors: %v %v", resp, err)
	}
}

// TestTwoReplicasOnOneRedisAdmitExactlyTheLimit drives two replicas, each with
// its own quota service on one Redis, from many goroutines, window after
// window: together they admit exactly the limit of each window (never more,
// and not less while demand remains), and most decisions take no round.
func TestTwoReplicasOnOneRedisAdmitExactlyTheLimit(t *testing.T) {
	const L = 500
	f := newFixture(t, `{"policy":"fleet","rules":[
	 {"id":"w","descriptor":{"domain":"d","entries":[{"key":"generic_key","value":"w"}]},"algorithm":"fixed_window","limit":500,"window":"1s","scope":"fleet"}]}`)
	rs := []*replica{f.replica(t, "a", ""), f.replica(t, "b", "")}
	for w := 0; w < 5; w++ {
		var admitted, calls atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(r *replica) {
				defer wg.Done()
				// Until this replica says over three times in a row: demand
				// remains on both until each has spent what it holds.
				for over := 0; over < 3; {
					resp := r.call(t, "d", desc("generic_key", "w"))
					calls.Add(1)
					if resp.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted.Add(1)
						over = 0
					} else {
						over++
					}
				}
			}(rs[g%2])
		}
		wg.Wait()
		if got := admitted.Load(); got != L {
			t.Errorf("window %d: %d admitted of %d calls, want exactly %d", w, got, calls.Load(), L)
		}
		f.clk.advance(time.Second)
	}
	asks := counterWith(t, rs[0].reg, "sluice_controlplane_rls_asks_total", "", "") + counterWith(t, rs[1].reg, "sluice_controlplane_rls_asks_total", "", "")
	t.Logf("asks of the quota service: %v for %d admitted", asks, 5*L)
	if asks > 5*L/4 {
		t.Errorf("%v asks for %d admissions: the leases are not held", asks, 5*L)
	}
}

// TestATokenBucketHoldsTheFleetBound: a fleet token bucket of capacity C
// admits at once C − k, k the units that refill during one lease's validity
// (quota's newFleetLimiter: the fleet's bound stays C + rate·t whenever leased
// units are spent), then its rate.
func TestATokenBucketHoldsTheFleetBound(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "")
	burst := func() int {
		n := 0
		for ; n < 10; n++ {
			if r.call(t, "other", desc("generic_key", "tb")).OverallCode != rlsv3.RateLimitResponse_OK {
				break
			}
		}
		return n
	}
	if n := burst(); n != 2 { // 4/s, C = 4: k = min(⌊C/2⌋, 4·10 s) = 2
		t.Fatalf("admitted %d at once, want C − k = 2", n)
	}
	f.clk.advance(500 * time.Millisecond) // 2 tokens refill
	if n := burst(); n != 2 {
		t.Fatalf("admitted %d after half a second at 4/s, want 2", n)
	}
	f.clk.advance(10 * time.Second) // full again: never more than C − k at once
	if n := burst(); n != 2 {
		t.Fatalf("admitted %d from a full bucket, want 2", n)
	}
}

// TestAnIdleLeaseGivesItsUnitsBack: units a replica leased and stopped using
// are returned by the sweep, so another replica may admit them in the same
// window; a decision after the sweep starts a lease afresh.
func TestAnIdleLeaseGivesItsUnitsBack(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	a, b := f.replica(t, "a", ""), f.replica(t, "b", "")
	for i := 0; i < 2; i++ { // the second ask leases more than it spends
		if resp := a.call(t, "edge", desc("generic_key", "api")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a: %v", resp)
		}
	}
	f.clk.advance(idleAfter + time.Second) // same minute: the fixture starts at one
	a.srv.sweep(context.Background())
	n := 0
	for ; n < 20; n++ {
		if b.call(t, "edge", desc("generic_key", "api")).OverallCode != rlsv3.RateLimitResponse_OK {
			break
		}
	}
	if n != 8 {
		t.Fatalf("b admitted %d of the window's 10 after a's 2, want 8 (a's unspent units returned)", n)
	}
	if resp := a.call(t, "edge", desc("generic_key", "api")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a after the sweep, the window spent: %v", resp)
	}
}

// TestARedisOutageIsDecidedByOnQuotaFailure: with the quota store gone, each
// rule's on_quota_failure decides, and the decisions are counted.
func TestARedisOutageIsDecidedByOnQuotaFailure(t *testing.T) {
	f := newFixture(t, `{"policy":"down","rules":[
	 {"id":"p","descriptor":{"domain":"d","entries":[{"key":"k","value":"p"}]},"algorithm":"fixed_window","limit":4,"window":"1m","scope":"fleet","on_quota_failure":"pass"},
	 {"id":"n","descriptor":{"domain":"d","entries":[{"key":"k","value":"n"}]},"algorithm":"fixed_window","limit":4,"window":"1m","scope":"fleet","on_quota_failure":"deny"},
	 {"id":"l","descriptor":{"domain":"d","entries":[{"key":"k","value":"l"}]},"algorithm":"fixed_window","limit":4,"window":"1m","scope":"fleet","local_share":0.5}]}`)
	r := f.replica(t, "a", "")
	f.redis.Kill()
	count := func(v string) (ok int) {
		for i := 0; i < 6; i++ {
			if r.call(t, "d", desc("k", v)).OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := count("p"); got != 6 {
		t.Errorf("pass: %d of 6 admitted, want all", got)
	}
	if got := count("n"); got != 0 {
		t.Errorf("deny: %d of 6 admitted, want none", got)
	}
	if got := count("l"); got != 2 {
		t.Errorf("local at half of 4: %d of 6 admitted, want 2", got)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_failure_decisions_total", "", ""); got != 18 {
		t.Errorf("failure decisions %v, want 18", got)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_ask_failures_total", "", ""); got < 3 {
		t.Errorf("ask failures %v, want one per rule at least", got)
	}
}

// TestUnlimitedAndReplacesAreHonoured: an unlimited descriptor is OK without a
// limit and takes precedence over the key alone, as a more specific node of
// envoyproxy/ratelimit's tree; a rule replaced by another descriptor's rule
// in the same call is neither checked nor counted.
func TestUnlimitedAndReplacesAreHonoured(t *testing.T) {
	f := newFixture(t, `{"policy":"r","rules":[
	 {"id":"per-ip","descriptor":{"domain":"d","entries":[{"key":"remote_address"}]},"algorithm":"fixed_window","limit":1,"window":"1m","scope":"fleet"},
	 {"id":"office","descriptor":{"domain":"d","entries":[{"key":"remote_address","value":"10.0.0.1"}],"unlimited":true}},
	 {"id":"global","descriptor":{"domain":"d","entries":[{"key":"generic_key","value":"all"}]},"algorithm":"fixed_window","limit":2,"window":"1m","scope":"fleet"},
	 {"id":"vip","descriptor":{"domain":"d","entries":[{"key":"plan","value":"vip"}],"replaces":["global"],"name":"vip-limit"},"algorithm":"fixed_window","limit":5,"window":"1m","scope":"fleet"}]}`)
	r := f.replica(t, "a", "")
	for i := 0; i < 3; i++ {
		resp := r.call(t, "d", desc("remote_address", "10.0.0.1"))
		if st := resp.Statuses[0]; resp.OverallCode != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != math.MaxUint32 {
			t.Fatalf("unlimited %d: %v", i, resp)
		}
	}
	if r.call(t, "d", desc("remote_address", "10.0.0.2")).OverallCode != rlsv3.RateLimitResponse_OK ||
		r.call(t, "d", desc("remote_address", "10.0.0.2")).OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal("the key alone is not limited to 1")
	}
	// With the vip descriptor in the call, global is not checked nor counted.
	for i := 0; i < 4; i++ {
		resp := r.call(t, "d", desc("generic_key", "all"), desc("plan", "vip"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetName() != "vip-limit" {
			t.Fatalf("replaced %d: %v", i, resp)
		}
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := r.call(t, "d", desc("generic_key", "all")).OverallCode; got != want {
			t.Fatalf("global alone %d: %v, want %v (the replaced calls counted nothing)", i, got, want)
		}
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_descriptors_total", "result", "replaced"); got != 4 {
		t.Errorf("replaced %v, want 4", got)
	}
}

// TestALimitOverrideCountsOnItsDescriptorsCounter: a descriptor carrying a
// limit (Envoy's rate_limits limit override) is limited to it, whatever rule
// its entries match, in any domain a rule names, on the counter of its
// domain, entries and window, as envoyproxy/ratelimit's (src/limiter/
// cache_key.go: the limit is not part of it): the rule of the same entries and
// window counts on it too, and so does an override of another limit; 0 is
// always over.
func TestALimitOverrideCountsOnItsDescriptorsCounter(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "")
	over := func(rpu uint32, kv ...string) *commonrl.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp := r.call(t, "edge", over(2, "generic_key", "api"))
		st := resp.Statuses[0]
		if resp.OverallCode != want || st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("override %d: %v, want %v under 2 a minute", i, resp, want)
		}
	}
	// The rule of these entries (10 a minute) counts on the same counter: 2
	// admitted by the override, this call the third.
	if resp := r.call(t, "edge", desc("generic_key", "api")); resp.Statuses[0].LimitRemaining != 7 {
		t.Fatalf("the rule after overrides: %v", resp)
	}
	// An override of 4 a minute finds 3 counted: one more, then over.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if resp := r.call(t, "edge", over(4, "generic_key", "api")); resp.OverallCode != want {
			t.Fatalf("a limit of 4, call %d: %v, want %v", i, resp, want)
		}
	}
	// Entries no rule names: a counter of their own, shared by every limit.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK} {
		if got := r.call(t, "edge", over(3, "anything", "y")).OverallCode; got != want {
			t.Fatalf("3 a minute on unnamed entries %d: %v, want %v", i, got, want)
		}
	}
	if resp := r.call(t, "edge", over(2, "anything", "y")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("2 a minute after 2 counted at 3 a minute: %v", resp)
	}
	// Entries no rule names, in a domain a rule does: limited all the same.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := r.call(t, "edge", over(1, "anything", "x")).OverallCode; got != want {
			t.Fatalf("unnamed entries %d: %v, want %v", i, got, want)
		}
	}
	if resp := r.call(t, "nowhere", over(1, "generic_key", "api")); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("a domain no rule names: %v", resp)
	}
	if resp := r.call(t, "edge", over(0, "generic_key", "zero")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a limit of 0: %v", resp)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_limit_overrides_total", "", ""); got != 12 {
		t.Errorf("overrides counted %v, want 12", got)
	}
}

// TestDescriptorsAreCountedByTheirRulesDomainAndIdBounded: each rule's
// descriptors are counted under its domain and policy/id, descriptors no rule
// names under empty labels (a request's domain is not a label: it is the
// caller's to choose), and past maxRuleSeries rules the rest share "(other)".
func TestDescriptorsAreCountedByTheirRulesDomainAndIdBounded(t *testing.T) {
	f := newFixture(t, rlsPolicy)
	r := f.replica(t, "a", "")
	for range 3 {
		r.call(t, "edge", desc("generic_key", "shadow"))
	}
	r.call(t, "made-up-domain", desc("k", "v"))
	series := map[string]float64{}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_controlplane_rls_descriptors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			series[l["result"]+" "+l["domain"]+" "+l["rule"]] = m.GetCounter().GetValue()
		}
	}
	if series["ok edge edge/shadowed"] != 1 || series["shadow edge edge/shadowed"] != 2 || series["no_rule  "] != 1 {
		t.Errorf("series %v: want the shadow rule's 1 ok and 2 shadow under edge edge/shadowed, 1 no_rule unlabelled", series)
	}
	for k := range series {
		if strings.Contains(k, "made-up-domain") {
			t.Errorf("a request's domain became a label: %s", k)
		}
	}
	m := newMetrics(nil, func() float64 { return 0 })
	for i := range maxRuleSeries + 5 {
		m.forRule("d", "p/r"+strconv.Itoa(i))
	}
	if c := m.forRule("d", "p/another"); c != m.forRule("(other)", "(other)") || len(m.rules) != maxRuleSeries+1 {
		t.Errorf("%d rule series; past %d rules, want one shared (other)", len(m.rules), maxRuleSeries)
	}
}
