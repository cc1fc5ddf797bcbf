package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestFleetRuleWithoutControlPlaneDegrades: a fleet rule in a static policy
// with no control_plane section has no quota service to ask; it is decided
// at once (no pause) as its on_quota_failure says, recorded as degraded.
func TestFleetRuleWithoutControlPlaneDegrades(t *testing.T) {
	buildWasm(t)
	for _, tc := range []struct {
		name, members string
		statuses      []int
	}{
		{"local_share", `,"local_share":0.5`, []int{200, 200, 429, 429}},
		{"local_default", ``, []int{200, 200, 200, 200, 429}},
		{"pass", `,"on_quota_failure":"pass"`, []int{200, 200, 200, 200, 200, 200}},
		{"deny", `,"on_quota_failure":"deny"`, []int{429, 429}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := `{"policy":"p","version":1,"rules":[{"id":"fleet","key":["client_ip"],"algorithm":"fixed_window","limit":4,"window":"1h","scope":"fleet"` + tc.members + `}]}`
			e := newEnv(t, `{"tick":"1m","policy":`+policy+`}`, 2)
			for i, want := range tc.statuses {
				r := e.do(i%2, req{path: "/x"})
				if r.Status != want {
					t.Fatalf("request %d: %d, want %d (%v)", i, r.Status, want, r.FilterState)
				}
				wantState(t, r.FilterState, map[string]string{
					"sluice.scope": "fleet", "sluice.quota": "degraded", "sluice.reason": "quota_unavailable",
				})
			}
			if got := e.metric("sluice.quota.degraded"); got != int64(len(tc.statuses)) {
				t.Fatalf("sluice.quota.degraded %d, want %d", got, len(tc.statuses))
			}
			if got := e.metric("sluice.quota.calls"); got != 0 {
				t.Fatalf("sluice.quota.calls %d without a control plane", got)
			}
		})
	}
}

// TestEnvoyScopeWritesNoFleetState: an envoy-scoped rule's filter state has
// neither scope nor quota.
func TestEnvoyScopeWritesNoFleetState(t *testing.T) {
	buildWasm(t)
	policy := `{"policy":"p","version":1,"rules":[{"id":"r","key":["client_ip"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+policy+`}`, 1)
	for i, want := range []int{200, 429} {
		r := e.do(0, req{path: "/x"})
		if r.Status != want {
			t.Fatalf("request %d: %d", i, r.Status)
		}
		for _, k := range []string{"scope", "quota"} {
			if v, ok := filterstate.Fields(r.FilterState)[k]; ok {
				t.Fatalf("request %d: %s=%q on an envoy-scoped rule", i, k, v)
			}
		}
	}
}

// TestACutOffEnvoyAdmitsItsLocalShareForEveryAlgorithm: with the quota service
// unreachable, on_quota_failure "local" and local_share 0.25, an Envoy admits
// about a quarter of the rule's limit whatever the algorithm, including a
// token_bucket or gcra whose burst is smaller than the share's multiple of a
// request's cost (each request counts 4 times its cost: a bucket of capacity 2
// never holds 4). Requests come every 100 ms of a virtual clock for two
// minutes; L = 100 a minute, so about 50 are admitted, plus the burst.
func TestACutOffEnvoyAdmitsItsLocalShareForEveryAlgorithm(t *testing.T) {
	buildWasm(t)
	for _, tc := range []struct{ name, alg string }{
		{"token_bucket burst 2", `"algorithm":"token_bucket","limit":100,"window":"1m","burst":2`},
		{"gcra burst 1", `"algorithm":"gcra","limit":100,"window":"1m","burst":1`},
		{"token_bucket", `"algorithm":"token_bucket","limit":100,"window":"1m"`},
		{"fixed_window", `"algorithm":"fixed_window","limit":100,"window":"1m"`},
		{"time_wheel", `"algorithm":"time_wheel","limit":100,"window":"1m","slots":6`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := `{"policy":"p","version":1,"rules":[{"id":"fleet","key":["client_ip"],` + tc.alg + `,"scope":"fleet","local_share":0.25}]}`
			e := newEnv(t, `{"tick":"1m","policy":`+policy+`}`, 2)
			admitted := 0
			for i := 0; i < 1200; i++ {
				r := e.do(i%2, req{path: "/x"})
				if r.Status == 200 {
					admitted++
				}
				e.clock.Advance(100 * time.Millisecond)
			}
			// Two minutes at a quarter of 100 a minute, plus at most the
			// burst (100 for the whole-limit bucket, a window's share for the
			// windows).
			if admitted < 40 || admitted > 50+26 {
				t.Fatalf("admitted %d of 1200 in two minutes, want about 50 (a quarter of the limit)", admitted)
			}
			t.Logf("admitted %d of 1200 in two minutes", admitted)
		})
	}
}

// TestASmallBucketsLocalStateIsNotTakenOverByAnotherKey: a cut-off Envoy
// decides a fleet token_bucket of a small burst with the rule refilled n
// times slower, whose state reaches further ahead than the rule's own. The
// record is stamped idle by the limiter that wrote it, so another key in the
// same table bucket does not take it over: a client that spent its burst
// stays denied after another client's request.
func TestASmallBucketsLocalStateIsNotTakenOverByAnotherKey(t *testing.T) {
	buildWasm(t)
	for _, alg := range []string{
		`"algorithm":"token_bucket","limit":24,"window":"24h","burst":2`,
		`"algorithm":"gcra","limit":24,"window":"24h","burst":1`,
	} {
		policy := `{"policy":"p","version":1,"identity":{"user_header":"x-user"},"rules":[` +
			`{"id":"fleet","key":["user"],` + alg + `,"scope":"fleet","local_share":0.1}]}`
		e := newEnv(t, `{"tick":"1m","buckets_per_rule":1,"entries_per_bucket":4,"policy":`+policy+`}`, 1)
		as := func(user string) req { return req{path: "/x", headers: host.Headers{{"x-user", user}}} }
		admitted := 0
		for i := 0; i < 5; i++ {
			if e.do(0, as("a")).Status == 200 {
				admitted++
			}
		}
		if admitted == 0 || admitted > 2 {
			t.Fatalf("%s: user a admitted %d of 5 by itself, want its burst", alg, admitted)
		}
		if r := e.do(0, as("a")); r.Status != 429 {
			t.Fatalf("%s: user a after its burst: %d, want 429", alg, r.Status)
		}
		e.do(0, as("b"))
		if r := e.do(0, as("a")); r.Status != 429 {
			t.Errorf("%s: user a after user b's request: %d, want 429 (its local bucket was taken over)", alg, r.Status)
		}
	}
}

// TestTheFilterStateNamesTheLimitThatDecided: the access log's limit is the
// one the decision reports, as the 429 body says, for a local rule and for a
// cut-off Envoy's fleet request decided by its local share (a share keeps
// the bucket's capacity and stretches its refill, so both report the burst).
func TestTheFilterStateNamesTheLimitThatDecided(t *testing.T) {
	buildWasm(t)
	for _, tc := range []struct{ name, rule string }{
		{"local rule", `{"id":"r","key":["client_ip"],"algorithm":"token_bucket","limit":100,"window":"1m","burst":2}`},
		{"degraded fleet rule", `{"id":"r","key":["client_ip"],"algorithm":"token_bucket","limit":100,"window":"1m","burst":2,"scope":"fleet","local_share":0.25}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"tick":"1m","policy":{"policy":"p","version":1,"rules":[`+tc.rule+`]}}`, 1)
			denied := 0
			for i := 0; i < 20; i++ {
				r := e.do(0, req{path: "/x"})
				state := filterstate.Fields(r.FilterState)["limit"]
				if state != "2" {
					t.Fatalf("request %d (status %d): filter state limit %q, want the burst, 2", i, r.Status, state)
				}
				if r.Status == 429 {
					denied++
					if body := strconv.FormatUint(decodeReply(t, r).Data.Limit, 10); state != body {
						t.Fatalf("request %d: filter state limit %s, the 429 body's %s", i, state, body)
					}
				}
			}
			if denied == 0 {
				t.Fatal("no request was denied: the body's limit was never compared")
			}
		})
	}
}
