package main

import (
	"maps"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestPolicyChoosesResponseHeaders: a policy's response_headers decides the
// rate-limit headers of its responses over the plugin configuration's
// headers and headers_on_allow; without it the configuration decides, and
// by default an allowed response carries none and a denial X-RateLimit-*.
func TestPolicyChoosesResponseHeaders(t *testing.T) {
	buildWasm(t)
	const rule = `{"id":"r","key":["user"],"algorithm":"fixed_window","limit":2,"window":"10s"}`
	all := []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit", "ratelimit-policy"}
	only := func(set map[string]string) map[string]string {
		want := map[string]string{}
		for _, k := range all {
			want[k] = set[k] // "" = absent
		}
		return want
	}
	xAllowed := map[string]string{"x-ratelimit-limit": "2", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "10"}
	xDenied := map[string]string{"x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "10"}
	ietfAllowed := map[string]string{"ratelimit-policy": `"r";q=2;w=10`, "ratelimit": `"r";r=1;t=10`}
	ietfDenied := map[string]string{"ratelimit-policy": `"r";q=2;w=10`, "ratelimit": `"r";r=0;t=10`}
	for _, tc := range []struct {
		name            string
		config          string // plugin configuration members beside tick and policy
		responseHeaders string // the policy's response_headers ("": absent)
		allowed, denied map[string]string
	}{
		{"defaults", ``, ``, nil, xDenied},
		{"configuration on allow", `"headers_on_allow":true,`, ``, xAllowed, xDenied},
		{"configuration ratelimit", `"headers":"ratelimit",`, ``, nil, ietfDenied},
		{"policy ratelimit on allow over configuration", `"headers":"x-ratelimit",`, `{"set":"ratelimit","on_allow":true}`, ietfAllowed, ietfDenied},
		{"policy denials only over configuration on allow", `"headers":"both","headers_on_allow":true,`, `{"set":"x-ratelimit"}`, nil, xDenied},
		{"policy none", `"headers_on_allow":true,`, `{"set":"none","on_allow":true}`, nil, nil},
		{"policy both", ``, `{"set":"both","on_allow":true}`, merge(xAllowed, ietfAllowed), merge(xDenied, ietfDenied)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"tick":"1m",`+tc.config+`"policy":`+benchPolicyHeaders(tc.responseHeaders, rule)+`}`, 1)
			send := func() host.Response {
				return e.do(0, req{path: "/", headers: host.Headers{{"x-user-id", "u"}}})
			}
			if r := send(); r.Status != 200 {
				t.Fatalf("first request: %d, want 200", r.Status)
			} else {
				wantHeaders(t, r.Headers, only(tc.allowed))
			}
			send()
			r := send()
			if r.Status != 429 {
				t.Fatalf("third request: %d, want 429", r.Status)
			}
			wantHeaders(t, r.Headers, only(tc.denied))
			wantHeaders(t, r.Headers, map[string]string{"retry-after": "10"})
		})
	}
}

// merge returns a new map with a's entries, then b's.
func merge(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// TestABucketsRateLimitPolicyIsWhatAClientCanPaceBy: for a token_bucket or gcra,
// RateLimit-Policy names the bucket's capacity as q and the whole seconds the
// bucket takes to refill it as w (rounded up, so a client pacing by q per w never
// outruns the refill), not the rule's window: a bucket of 10 refilled at 60 a
// minute says q=10;w=10 (10 requests every 10 s: the whole allowance), where q=10
// with the minute's w=60 would pace a client at a sixth of it
// (draft-ietf-httpapi-ratelimit-headers-09, section 3: q, the quota, and w, the
// time window in seconds, of a policy). A window algorithm keeps its window.
func TestABucketsRateLimitPolicyIsWhatAClientCanPaceBy(t *testing.T) {
	buildWasm(t)
	for _, tc := range []struct{ name, alg, want string }{
		{"token_bucket burst 10 of 60/min", `"algorithm":"token_bucket","limit":60,"window":"1m","burst":10`, `"r";q=10;w=10`},
		{"token_bucket of 5/min", `"algorithm":"token_bucket","limit":5,"window":"1m"`, `"r";q=5;w=60`},
		{"gcra 100/min burst 1", `"algorithm":"gcra","limit":100,"window":"1m","burst":1`, `"r";q=2;w=2`},
		{"fixed_window", `"algorithm":"fixed_window","limit":2,"window":"10s"`, `"r";q=2;w=10`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := `{"id":"r","key":["user"],` + tc.alg + `}`
			e := newEnv(t, `{"tick":"1m","policy":`+benchPolicyHeaders(`{"set":"ratelimit","on_allow":true}`, rule)+`}`, 1)
			r := e.do(0, req{path: "/", headers: host.Headers{{"x-user-id", "u"}}})
			wantHeaders(t, r.Headers, map[string]string{"ratelimit-policy": tc.want})
		})
	}
}

// TestAFleetBucketsRateLimitPolicyIsTheSameAsPerEnvoy: a fleet token_bucket or
// gcra decided from its lease says what the same rule per Envoy says, the
// bucket's capacity per its refill time (q=10;w=10 for a bucket of 10 at 60 a
// minute), in RateLimit-Policy and X-RateLimit-Limit alike: not the rule's
// limit over the bucket's refill time (q=60;w=10, six times the rate).
func TestAFleetBucketsRateLimitPolicyIsTheSameAsPerEnvoy(t *testing.T) {
	buildWasm(t)
	for _, tc := range []struct{ name, alg, policy, limit string }{
		{"token_bucket burst 10 of 60/min", `"algorithm":"token_bucket","limit":60,"window":"1m","burst":10`, `"r0";q=10;w=10`, "10"},
		{"gcra 100/min burst 1", `"algorithm":"gcra","limit":100,"window":"1m","burst":1`, `"r0";q=2;w=2`, "2"},
		{"fixed_window", `"algorithm":"fixed_window","limit":2,"window":"10s"`, `"r0";q=2;w=10`, "2"},
	} {
		for _, scope := range []string{"envoy", "fleet"} {
			t.Run(tc.name+" "+scope, func(t *testing.T) {
				rule := `{"id":"r0","key":["user"],` + tc.alg + `,"scope":"` + scope + `"}`
				doc := benchPolicyHeaders(`{"set":"both","on_allow":true}`, rule)
				e := newEnv(t, `{"tick":"1m","policy":`+doc+`}`, 1)
				e.do(0, req{path: "/probe"}) // the hash key exists from here on
				if scope == "fleet" {
					seedLease(t, e.h, doc, "u")
				}
				r := e.do(0, req{path: "/", headers: host.Headers{{"x-user-id", "u"}}})
				if q := filterstate.Fields(r.FilterState)["quota"]; scope == "fleet" && q != "local" {
					t.Fatalf("not decided from the lease: quota %q", q)
				}
				wantHeaders(t, r.Headers, map[string]string{"ratelimit-policy": tc.policy, "x-ratelimit-limit": tc.limit})
			})
		}
	}
}
