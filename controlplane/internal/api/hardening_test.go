package api_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// TestRollbackBodyIsStrict: the rollback body is decoded as strictly as a
// policy: duplicate keys, unknown fields and trailing data are 400s.
func TestRollbackBodyIsStrict(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	c := r.admin
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 2)), 200, "update")
	for _, body := range []string{
		`{"version":1,"version":2}`,
		`{"version":1,"extra":true}`,
		`{"version":1} {"version":2}`,
		`{"version":1}x`,
		`{"version":1.0}`,
		`{"version":"1"}`,
		`{"version":-1}`,
		`{"version":null}`,
		`{}`,
		`[1]`,
	} {
		resp := c.Do("POST", "/v1/policies/p/rollback", []byte(body))
		expectCode(t, resp, 400, "invalid_document", "rollback "+body)
		if !bytes.Contains(resp.Body, []byte(`"field"`)) {
			t.Errorf("rollback %s: no field named: %s", body, resp.Body)
		}
	}
	if got := decodePolicy(t, c.Do("GET", "/v1/policies/p", nil)); got.Version != 2 {
		t.Fatalf("a refused rollback changed the policy: version %d", got.Version)
	}
	expect(t, c.Do("POST", "/v1/policies/p/rollback", []byte(` {"version": 1} `)), 200, "rollback")
}

// TestOnlyApplicationJSONIsAccepted: a patch media type is never taken as a
// whole-policy replacement.
func TestOnlyApplicationJSONIsAccepted(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	c := r.admin
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	for _, ct := range []string{"application/merge-patch+json", "application/json-patch+json", "application/vnd.sluice+json", "text/json", "application/jsonx"} {
		expectCode(t, c.Do("PUT", "/v1/policies/p", []byte(`{"rules":[]}`), "Content-Type", ct), 415, "unsupported_media_type", "PUT "+ct)
		expectCode(t, c.Do("POST", "/v1/policies/p/rules", ruleDoc("r2", 1), "Content-Type", ct), 415, "unsupported_media_type", "POST rule "+ct)
		expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":1}`), "Content-Type", ct), 415, "unsupported_media_type", "rollback "+ct)
	}
	if p := decodePolicy(t, c.Do("GET", "/v1/policies/p", nil)); p.Version != 1 || len(p.Rules) != 1 {
		t.Fatalf("policy changed by a refused request: %+v", p)
	}
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 2), "Content-Type", "Application/JSON; charset=utf-8"), 200, "application/json with parameters")
}

// TestPolicyWithoutRulesIsRefused: a PUT must say which rules the policy
// has; an explicitly empty list is allowed.
func TestPolicyWithoutRulesIsRefused(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	c := r.admin
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	for _, body := range []string{`{}`, `{"policy":"p"}`, `{"rules":null}`, `{"policy":"p","identity":{"user_header":"x-user"}}`} {
		resp := c.Do("PUT", "/v1/policies/p", []byte(body))
		expectCode(t, resp, 400, "invalid_document", "PUT "+body)
		if !bytes.Contains(resp.Body, []byte(`"field":"rules"`)) {
			t.Errorf("PUT %s: the error does not name rules: %s", body, resp.Body)
		}
	}
	if p := decodePolicy(t, c.Do("GET", "/v1/policies/p", nil)); p.Version != 1 || len(p.Rules) != 1 {
		t.Fatalf("policy changed by a refused request: %+v", p)
	}
	if p := decodePolicy(t, c.Do("PUT", "/v1/policies/p", []byte(`{"rules":[]}`))); p.Version != 2 || len(p.Rules) != 0 {
		t.Fatalf("explicitly empty rules: %+v", p)
	}
	expect(t, c.Do("PUT", "/v1/policies/q", []byte(`{"policy":"q","rules":[]}`)), 201, "create with no rules")
}

// TestOpenModeChecksHostAndOrigin: without tokens, only loopback Host names
// are served and cross-origin writes are refused (DNS rebinding, CSRF).
func TestOpenModeChecksHostAndOrigin(t *testing.T) {
	r := startReplica(t, boltBackend(t), func(o *api.Options) { o.AdminToken, o.ReadToken = "", "" })
	c := r.anon
	u, _ := url.Parse(r.ts.URL)
	port := u.Port()
	for _, host := range []string{"evil.example", "evil.example:" + port, "localhost.evil.example", "127.0.0.1.nip.io:" + port, "10.0.0.1", "[::2]:" + port, "0.0.0.0:" + port} {
		expectCode(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1), "Host", host), 403, "forbidden_host", "PUT with Host "+host)
		expectCode(t, c.Do("GET", "/v1/policies", nil, "Host", host), 403, "forbidden_host", "GET with Host "+host)
		expectCode(t, c.Do("GET", "/metrics", nil, "Host", host), 403, "forbidden_host", "metrics with Host "+host)
	}
	for _, origin := range []string{"http://evil.example", "http://evil.example:" + port, "null", "http://localhost:1", "https://127.0.0.1:" + port} {
		expectCode(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1), "Origin", origin), 403, "forbidden_origin", "PUT from "+origin)
		expectCode(t, c.Do("DELETE", "/v1/policies/p", nil, "Origin", origin), 403, "forbidden_origin", "DELETE from "+origin)
	}
	expect(t, c.Do("GET", "/v1/policies", nil, "Origin", "http://evil.example"), 200, "a cross-origin read (the browser hides the answer)")
	expectCode(t, c.Do("GET", "/v1/policies/p", nil), 404, "not_found", "nothing was written")
	for i, host := range []string{"localhost", "localhost:" + port, "LOCALHOST:" + port, "127.0.0.1", "127.0.0.1:" + port, "127.1.2.3:" + port, "[::1]", "[::1]:" + port} {
		name := fmt.Sprintf("p%d", i)
		expect(t, c.Do("PUT", "/v1/policies/"+name, policyDoc(name, 1), "Host", host), 201, "PUT with Host "+host)
	}
	expect(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1), "Origin", r.ts.URL), 201, "same-origin PUT")

	// With tokens, any Host is served (the listener may be public).
	r2 := startReplica(t, boltBackend(t))
	expect(t, r2.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1), "Host", "cp.internal:8080"), 201, "PUT with a token and any Host")
}

// TestPolicyCountIsCapped: creating a policy beyond MaxPolicies is refused;
// updates and re-creations within the cap are not.
func TestPolicyCountIsCapped(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := startReplica(t, b, func(o *api.Options) { o.MaxPolicies = 3 })
			c := r.admin
			for _, n := range []string{"a", "b", "c"} {
				expect(t, c.Do("PUT", "/v1/policies/"+n, policyDoc(n, 1)), 201, "create "+n)
			}
			resp := c.Do("PUT", "/v1/policies/d", policyDoc("d", 1))
			expectCode(t, resp, 409, "too_many_policies", "create beyond the cap")
			if !bytes.Contains(resp.Body, []byte("3")) {
				t.Errorf("the error does not name the cap: %s", resp.Body)
			}
			expect(t, c.Do("PUT", "/v1/policies/a", policyDoc("a", 2)), 200, "update at the cap")
			expect(t, c.Do("DELETE", "/v1/policies/a", nil), 200, "delete")
			expect(t, c.Do("PUT", "/v1/policies/d", policyDoc("d", 1)), 201, "create after a delete")
			expectCode(t, c.Do("POST", "/v1/policies/a/rollback", []byte(`{"version":2}`)), 404, "version_expired", "rollback of a deleted policy")
		})
	}
}

// TestMetricsCardinalityIsBounded: the public metrics do not list every
// policy name.
func TestMetricsCardinalityIsBounded(t *testing.T) {
	r := startReplica(t, boltBackend(t), func(o *api.Options) { o.MaxPolicies = 1000 })
	n := api.MaxPolicyMetrics + 20
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("p%04d", i)
		expect(t, r.admin.Do("PUT", "/v1/policies/"+name, policyDoc(name, 1)), 201, "create")
	}
	m := r.anon.Do("GET", "/metrics", nil)
	expect(t, m, 200, "metrics")
	if got := strings.Count(string(m.Body), "sluice_controlplane_policy_version{"); got > api.MaxPolicyMetrics {
		t.Fatalf("%d per-policy series for %d policies, want at most %d", got, n, api.MaxPolicyMetrics)
	}
	if !bytes.Contains(m.Body, []byte(fmt.Sprintf("sluice_controlplane_policies %d", n))) {
		t.Fatalf("metrics lack the policy count %d", n)
	}
}

// TestOnlyAWriteThatTookPlaceWarns: a write answers the Warning headers of
// its policy only when it was written (or would be, in a dry run); one
// refused after validation (the policy cap, the size of the result) carries
// none, so a client never warns about a policy that was not written.
func TestOnlyAWriteThatTookPlaceWarns(t *testing.T) {
	r := startReplica(t, boltBackend(t), func(o *api.Options) {
		o.MaxPolicies = 1
		o.Warnings = func(*rules.Policy) []string { return []string{"works poorly"} }
	})
	c := r.admin
	const want = `299 - "works poorly"`
	if resp := c.Do("PUT", "/v1/policies/a", policyDoc("a", 1)); resp.Status != 201 || resp.Header.Get("Warning") != want {
		t.Fatalf("a create: %d, Warning %q, want 201 and %q", resp.Status, resp.Header.Get("Warning"), want)
	}
	if resp := c.Do("PUT", "/v1/policies/a?dry_run=true", policyDoc("a", 2)); resp.Header.Get("Warning") != want {
		t.Errorf("a dry run: %d, Warning %q, want %q", resp.Status, resp.Header.Get("Warning"), want)
	}
	resp := c.Do("PUT", "/v1/policies/b", policyDoc("b", 1))
	expectCode(t, resp, 409, "too_many_policies", "create beyond the cap")
	if w := resp.Header.Values("Warning"); len(w) != 0 {
		t.Errorf("a create refused by the policy cap warns: %q", w)
	}
}

// TestAWrongTokenIsLogged: a request with a bearer token that is neither the
// admin nor the read token is answered 403 and logged (once in a while, with
// where it came from and what it asked, never the token), so an operator can
// find a proxy or a tool holding a stale token.
func TestAWrongTokenIsLogged(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	r := startReplica(t, boltBackend(t), func(o *api.Options) {
		o.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(p)
		}), nil))
	})
	c := apitest.New(t, r.ts.URL, "a-stale-token-of-some-proxy")
	expectCode(t, c.Do("GET", "/v1/policies/p", nil), 403, "forbidden", "a wrong token")
	mu.Lock()
	got := logs.String()
	mu.Unlock()
	if !strings.Contains(got, "bearer token") || !strings.Contains(got, "/v1/policies/p") || strings.Contains(got, "a-stale-token-of-some-proxy") {
		t.Errorf("the log of a wrong token: %q, want one naming the path and not the token", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestADescriptorAnotherPolicyNamesIsRefusedAtApply: the RateLimitService
// serves one rule per descriptor, so a second policy naming a descriptor of
// the first is refused when written (409 descriptor_conflict, both named),
// not ignored when served; another descriptor, or the first policy's own
// change, is accepted.
func TestADescriptorAnotherPolicyNamesIsRefusedAtApply(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	c := r.admin
	doc := func(name, id, value string) []byte {
		return []byte(`{"policy":"` + name + `","rules":[{"id":"` + id + `","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"` + value + `"},{"key":"user"}]},` +
			`"algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet"}]}`)
	}
	expect(t, c.Do("PUT", "/v1/policies/first", doc("first", "per-user", "api")), 201, "the first policy")
	resp := c.Do("PUT", "/v1/policies/second", doc("second", "mine", "api"))
	expectCode(t, resp, 409, "descriptor_conflict", "a second policy with the same descriptor")
	if !bytes.Contains(resp.Body, []byte(`per-user`)) || !bytes.Contains(resp.Body, []byte(`first`)) {
		t.Errorf("the refusal does not name the rule and policy already serving it: %s", resp.Body)
	}
	expect(t, c.Do("PUT", "/v1/policies/second", doc("second", "mine", "web")), 201, "another descriptor")
	expect(t, c.Do("PUT", "/v1/policies/first", []byte(strings.Replace(string(doc("first", "per-user", "api")), `"limit":3`, `"limit":4`, 1))), 200,
		"the first policy's own change")
	expectCode(t, c.Do("PUT", "/v1/policies/second/rules/mine", []byte(`{"id":"mine","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"api"},{"key":"user"}]},`+
		`"algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet"}`)), 409, "descriptor_conflict", "a rule changed to the first's descriptor")
}
