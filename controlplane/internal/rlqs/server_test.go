package rlqs

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	sq "github.com/sluice-proxy/sluice/shared/quota"
)

func report(domain string, allowed, denied uint64, ids ...map[string]string) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, id := range ids {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: allowed, NumRequestsDenied: denied})
	}
	return r
}

type fixture struct {
	now int64
	pol *policies
	q   *quota.Service
	srv *Server
	reg *prometheus.Registry
}

func newFixture(t testing.TB) *fixture {
	f := &fixture{pol: &policies{}, reg: prometheus.NewRegistry()}
	m := int64(time.Minute)
	f.now = time.Now().UnixNano()/m*m + m
	f.pol.set(t, simPolicy)
	clock := func() int64 { return f.now }
	f.q = quota.New(quota.Options{Backend: quota.NewMemory(), Policies: f.pol, Open: true, Now: clock, Timeout: time.Minute, Registry: f.reg})
	f.srv = New(Options{Quota: f.q, Now: clock, Registry: f.reg})
	return f
}

// send answers r on ss and records the response as sent now.
func (f *fixture) send(ss *stream, r *rlqsv3.RateLimitQuotaUsageReports) *rlqsv3.RateLimitQuotaResponse {
	resp, after := ss.handle(context.Background(), r)
	for _, fn := range after {
		fn(f.now)
	}
	return resp
}

func TestBucketsThatNameNoServableRuleAreAbandoned(t *testing.T) {
	f := newFixture(t)
	ss := f.srv.newStream("")
	for _, tc := range []struct {
		reason string
		id     map[string]string
	}{
		{ReasonNoPolicyEntry, map[string]string{"rule": "fw", "user": "a"}},
		{quota.ReasonUnknownPolicy, map[string]string{"policy": "nope", "rule": "fw", "user": "a"}},
		{quota.ReasonUnknownRule, map[string]string{"policy": "p", "rule": "nope", "user": "a"}},
		{quota.ReasonNotFleet, map[string]string{"policy": "p", "rule": "local"}},
		{ReasonMissingKeyPart, map[string]string{"policy": "p", "rule": "fw"}},
		{ReasonUnknownEntry, map[string]string{"policy": "p", "rule": "fw", "user": "a", "colour": "red"}},
		{ReasonBadValue, map[string]string{"policy": "p", "rule": "ip", "client_ip": "not-an-ip"}},
		{ReasonLeaseTooShort, map[string]string{"policy": "p", "rule": "short"}},
		{ReasonCost, map[string]string{"policy": "p", "rule": "costly"}},
	} {
		resp := f.send(ss, report(simEnv, 1, 0, tc.id))
		if err := resp.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		if len(applied(resp)) != 1 || applied(resp)[0].GetAbandonAction() == nil {
			t.Errorf("%s: %v, want an abandon action", tc.reason, resp)
			continue
		}
		if got := counterWith(t, f.reg, "sluice_controlplane_rlqs_abandoned_total", "reason", tc.reason); got != 1 {
			t.Errorf("abandoned{reason=%q} = %v, want 1", tc.reason, got)
		}
	}
	// Ids no valid answer can name are skipped, not answered with an invalid response.
	resp := f.send(ss, report(simEnv, 1, 0, map[string]string{"policy": "p", "rule": ""}, map[string]string{}))
	if len(applied(resp)) != 0 {
		t.Errorf("ids with an empty value, or none: %v, want no action", resp)
	}
	if got := counterWith(t, f.reg, "sluice_controlplane_rlqs_invalid_reports_total", "", ""); got != 2 {
		t.Errorf("invalid_reports_total = %v, want 2", got)
	}
	// A wrong domain is another env: no such counters, but the rule resolves, so
	// the bucket is served (its keys are that env's).
	resp = f.send(ss, report("other-env", 1, 0, map[string]string{"policy": "p", "rule": "tb", "user": "a"}))
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Errorf("a fleet bucket of another env: %v, want a token bucket", resp)
	}
}

// TestLongKeyValuesAreServedWithTheFiltersKey: a bucket whose user is 2 KB or
// 60 KB is served like any other, under the very counter key the Wasm filter
// builds for that user (a digest of the value), so both kinds of Envoy spend one
// budget for it.
func TestLongKeyValuesAreServedWithTheFiltersKey(t *testing.T) {
	f := newFixture(t)
	ss := f.srv.newStream("")
	for _, size := range []int{2 << 10, 60 << 10} {
		id := map[string]string{"policy": "p", "rule": "fw", "user": strings.Repeat("u", size)}
		resp := f.send(ss, report(simEnv, 1, 0, id))
		if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			t.Fatalf("a %d-byte user: %.300v, want a token bucket", size, resp)
		}
		fr, _ := f.q.Resolve("p", simEnv, "fw")
		want, _ := fr.Key(mustRequest(t, id))
		if len(want) > 200 {
			t.Fatalf("the filter's key for a %d-byte user is %d bytes", size, len(want))
		}
		var got string
		for _, b := range ss.buckets {
			if b.key == want {
				got = b.key
			}
		}
		if got == "" {
			t.Fatalf("no bucket under the filter's key %q", want)
		}
	}
}

// TestAReportIsClampedToWhatItCouldHaveAdmitted: a report of 2^64-1 requests on a
// fail-open rule is charged at most what the Envoy could have admitted (here one
// window of the limit, as it had no assignment yet), counted as clamped, so the
// key is not locked for longer than a window and the next window grants again.
func TestAReportIsClampedToWhatItCouldHaveAdmitted(t *testing.T) {
	f := newFixture(t)
	ss := f.srv.newStream("")
	id := map[string]string{"policy": "p", "rule": "pass", "user": "liar"}
	f.send(ss, report(simEnv, math.MaxUint64, 0, id))
	if charged := counterWith(t, f.reg, "sluice_controlplane_rlqs_units_charged_total", "", ""); charged > 300 {
		t.Fatalf("charged %v units for one report on a rule of 300 per 10 s", charged)
	}
	if got := counterWith(t, f.reg, "sluice_controlplane_rlqs_reports_clamped_total", "", ""); got != 1 {
		t.Fatalf("reports_clamped_total = %v, want 1", got)
	}
	// Another Envoy, in the next window, is granted.
	f.now += int64(10 * time.Second)
	other := f.srv.newStream("")
	resp := f.send(other, report(simEnv, 1, 0, id))
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("the next window: %.300v, want a token bucket", resp)
	}
}

func TestExemptClientsAreAllowedAll(t *testing.T) {
	f := newFixture(t)
	ss := f.srv.newStream("")
	resp := f.send(ss, report(simEnv, 5, 0, map[string]string{"policy": "p", "rule": "fw", "user": "vip"}))
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
		t.Fatalf("exempt user: %v, want ALLOW_ALL", resp)
	}
}

// TestSpentBudgetIsDenyAllUntilTheWindowTurns: once the key's budget is spent an
// Envoy without a live token bucket gets DENY_ALL lasting until the window ends;
// the next window grants again.
func TestSpentBudgetIsDenyAllUntilTheWindowTurns(t *testing.T) {
	f := newFixture(t)
	id := map[string]string{"policy": "p", "rule": "fw", "user": "u"}
	// Another client (a Wasm filter's lease) takes the whole window.
	fr, _ := f.q.Resolve("p", simEnv, "fw")
	key, _ := fr.Key(mustRequest(t, id))
	res, err := f.q.Handle(context.Background(), &sq.Request{Envoy: "wasm", Policy: "p", Version: fr.Version, Env: simEnv, Interval: time.Second,
		Keys: []sq.KeyRequest{{Rule: "fw", Key: key, Want: 300}}})
	if err != nil || res.Keys[0].Granted == 0 {
		t.Fatalf("%v %+v", err, res)
	}
	for res.Keys[0].Granted > 0 {
		res, _ = f.q.Handle(context.Background(), &sq.Request{Envoy: "wasm", Policy: "p", Version: fr.Version, Env: simEnv, Interval: time.Second,
			Keys: []sq.KeyRequest{{Rule: "fw", Key: key, Want: 300}}})
	}
	ss := f.srv.newStream("")
	f.now += int64(3 * time.Second)
	resp := f.send(ss, report(simEnv, 0, 10, id))
	a := applied(resp)[0].GetQuotaAssignmentAction()
	if a.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("spent budget: %v, want DENY_ALL", resp)
	}
	if ttl := a.GetAssignmentTimeToLive().AsDuration(); ttl < 7*time.Second {
		t.Errorf("DENY_ALL for %v; the window ends in 7 s", ttl)
	}
	f.now += int64(7 * time.Second)
	resp = f.send(ss, report(simEnv, 0, 10, id))
	tb := applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.MaxTokens < 10 {
		t.Fatalf("the next window: %v, want a token bucket of at least the 10 denied", resp)
	}
}

// TestUnspentUnitsReturnOnceSettled: units of an assignment the Envoy did not spend
// come back to the budget two reports later, not before.
func TestUnspentUnitsReturnOnceSettled(t *testing.T) {
	f := newFixture(t)
	id := map[string]string{"policy": "p", "rule": "fw", "user": "u"}
	ss := f.srv.newStream("")
	resp := f.send(ss, report(simEnv, 0, 199, id)) // wants 200 (+ refill reserve)
	tb := applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		t.Fatalf("%v", resp)
	}
	granted := ss.buckets[canonical(id)].credits[0].left // the units of the one assignment sent
	if granted < 100 {
		t.Fatalf("granted %d", granted)
	}
	// The Envoy spends 50 and asks for nothing more.
	for i, used := range []uint64{50, 0, 0} {
		f.now += int64(time.Second)
		f.send(ss, report(simEnv, used, 0, id))
		b := ss.buckets[canonical(id)]
		if i == 0 && b.returned != 0 {
			t.Fatalf("returned %d one report after the grant: it is still spendable", b.returned)
		}
		t.Logf("report %d: settled %d, used %d, returned %d", i+1, b.settled, b.epochUsed, b.returned)
	}
	b := ss.buckets[canonical(id)]
	if b.returned != granted-50 {
		t.Fatalf("returned %d, want %d (granted %d, 50 spent)", b.returned, granted-50, granted)
	}
	// The ledger credited them: the key's budget has them back.
	if got := counterWith(t, f.reg, "sluice_controlplane_quota_units_returned_total", "", ""); got != float64(granted-50) {
		t.Fatalf("the quota service credited %v units, want %d", got, granted-50)
	}
}

// TestHugeCountsDoNotWrap: counts that sum past 2^64 from a client are demand like any
// other: the bucket is answered with a token bucket, not left unanswered because a
// sum wrapped to zero.
func TestHugeCountsDoNotWrap(t *testing.T) {
	f := newFixture(t)
	ss := f.srv.newStream("")
	resp := f.send(ss, report(simEnv, math.MaxUint64, 1, map[string]string{"policy": "p", "rule": "tb", "user": "u"}))
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("a report of 2^64-1 requests: %v, want a token bucket", resp)
	}
}
