package main

import (
	"testing"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
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
