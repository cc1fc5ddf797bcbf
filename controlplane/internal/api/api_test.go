package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
)

// TestEndpoints walks every endpoint and error code on both stores; every
// response is validated against openapi.yaml by the apitest client.
func TestEndpoints(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := startReplica(t, b)
			c := r.admin

			// Unknown policy, invalid name, unknown endpoint, health.
			expectCode(t, c.Do("GET", "/v1/policies/p", nil), 404, "not_found", "GET unknown")
			expectCode(t, c.Do("GET", "/v1/policies/Bad!Name", nil), 400, "invalid_name", "GET invalid name")
			expectCode(t, c.Do("GET", "/v2/nothing", nil), 404, "not_found", "unknown endpoint")
			expect(t, r.anon.Do("GET", "/healthz", nil), 200, "healthz")
			expect(t, r.anon.Do("GET", "/readyz", nil), 200, "readyz")

			// Create: 201, ETag "v1"; the body's version is ignored.
			doc := policyDoc("p", 10)
			created := c.Do("PUT", "/v1/policies/p", bytes.Replace(doc, []byte(`{"policy":"p"`), []byte(`{"policy":"p","version":99`), 1))
			expect(t, created, 201, "PUT create")
			if p := decodePolicy(t, created); p.Version != 1 || p.Policy != "p" {
				t.Fatalf("created %+v", p)
			}
			get := c.Do("GET", "/v1/policies/p", nil)
			expect(t, get, 200, "GET")
			if get.ETag() != created.ETag() || tagVersion(get.ETag()) != 1 || !bytes.Equal(get.Body, created.Body) {
				t.Fatalf("GET = %s %s", get.ETag(), get.Body)
			}
			expect(t, r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", created.ETag()), 304, "If-None-Match current")
			expect(t, c.Do("GET", "/v1/policies/p", nil, "If-None-Match", `W/`+created.ETag()+`, "v0"`), 304, "If-None-Match weak list")
			expect(t, c.Do("GET", "/v1/policies/p", nil, "If-None-Match", `"v0"`), 200, "If-None-Match stale")
			expectCode(t, c.Do("GET", "/v1/policies/p", nil, "If-None-Match", `v1`), 400, "invalid_header", "If-None-Match unquoted")
			expectCode(t, c.Do("GET", "/v1/policies/p?wait=soon", nil), 400, "invalid_parameter", "bad wait")

			// Declarative apply of the same document: no new version.
			same := c.Do("PUT", "/v1/policies/p", doc)
			expect(t, same, 200, "PUT same")
			if same.ETag() != created.ETag() {
				t.Fatalf("PUT same ETag %s", same.ETag())
			}
			// Replace; "policy" may be absent.
			upd := c.Do("PUT", "/v1/policies/p", []byte(`{"rules":[{"id":"r1","algorithm":"fixed_window","limit":20,"window":"1m"}]}`))
			expect(t, upd, 200, "PUT replace without name")
			if p := decodePolicy(t, upd); p.Version != 2 || p.Rules[0].Limit != 20 || p.Policy != "p" {
				t.Fatalf("replaced %+v", p)
			}
			// Invalid documents: every problem reported.
			bad := c.Do("PUT", "/v1/policies/p", []byte(`{"policy":"p","rules":[{"id":"a","algorithm":"nope","limit":1,"window":"1m"},{"id":"b","algorithm":"fixed_window","limit":1,"window":"-1s"}]}`))
			expectCode(t, bad, 400, "invalid_document", "PUT invalid")
			got := errorFields(t, bad)
			if len(got) < 2 || !slices.Contains(got, "rules[0].algorithm") || !slices.Contains(got, "rules[1].window") {
				t.Fatalf("detail fields = %q, want rules[0].algorithm and rules[1].window", got)
			}
			expectCode(t, c.Do("PUT", "/v1/policies/p", policyDoc("other", 1)), 400, "invalid_document", "PUT name mismatch")
			expectCode(t, c.Do("PUT", "/v1/policies/p", []byte(`{"policy":`)), 400, "invalid_document", "PUT malformed")
			expectCode(t, c.Do("PUT", "/v1/policies/p", []byte(`[]`)), 400, "invalid_document", "PUT array")
			expectCode(t, c.Do("PUT", "/v1/policies/p", doc, "Content-Type", "text/plain"), 415, "unsupported_media_type", "PUT text/plain")
			expectCode(t, c.Do("PUT", "/v1/policies/p", nil), 415, "unsupported_media_type", "PUT no body")
			huge := []byte(`{"policy":"p","rules":[],"x":"` + strings.Repeat("a", 300<<10) + `"}`)
			expectCode(t, c.Do("PUT", "/v1/policies/p", huge), 413, "too_large", "PUT huge")
			expectCode(t, c.Do("PUT", "/v1/policies/Bad", doc), 400, "invalid_name", "PUT invalid name")

			// Conditional writes (RFC 9110 §13.1.1).
			expectCode(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 30), "If-Match", created.ETag()), 412, "precondition_failed", "If-Match stale")
			ok := c.Do("PUT", "/v1/policies/p", policyDoc("p", 30), "If-Match", upd.ETag())
			expect(t, ok, 200, "If-Match current")
			if tagVersion(ok.ETag()) != 3 {
				t.Fatalf("ETag after If-Match write %s", ok.ETag())
			}
			expectCode(t, c.Do("PUT", "/v1/policies/q", policyDoc("q", 1), "If-Match", "*"), 412, "precondition_failed", "If-Match * on missing")
			expectCode(t, c.Do("PUT", "/v1/policies/p", policyDoc("p", 1), "If-None-Match", "*"), 412, "precondition_failed", "If-None-Match * on existing")
			qc := c.Do("PUT", "/v1/policies/q", policyDoc("q", 1), "If-None-Match", "*")
			expect(t, qc, 201, "If-None-Match * create")
			expectCode(t, c.Do("PUT", "/v1/policies/q", policyDoc("q", 1), "If-Match", `garbage`), 400, "invalid_header", "If-Match malformed")

			// Rules.
			add := c.Do("POST", "/v1/policies/p/rules", ruleDoc("r2", 5), "X-Sluice-Actor", "alice")
			expect(t, add, 201, "POST rule")
			if add.Header.Get("Location") != "/v1/policies/p/rules/r2" || decodePolicy(t, add).Version != 4 {
				t.Fatalf("POST rule: Location %q, %s", add.Header.Get("Location"), add.Body)
			}
			expectCode(t, c.Do("POST", "/v1/policies/p/rules", ruleDoc("r2", 6)), 409, "duplicate_rule", "POST duplicate")
			expectCode(t, c.Do("POST", "/v1/policies/nope/rules", ruleDoc("r9", 6)), 404, "not_found", "POST rule to unknown policy")
			expectCode(t, c.Do("POST", "/v1/policies/p/rules", []byte(`{"id":"x","algorithm":"gcra"}`)), 400, "invalid_document", "POST invalid rule")
			expectCode(t, c.Do("POST", "/v1/policies/p/rules", ruleDoc("r3", 1), "If-Match", ok.ETag()), 412, "precondition_failed", "POST stale If-Match")
			expectCode(t, c.Do("GET", "/v1/policies/p/rules", nil), 405, "method_not_allowed", "GET rules collection")
			gr := c.Do("GET", "/v1/policies/p/rules/r2", nil)
			expect(t, gr, 200, "GET rule")
			var rule struct {
				ID    string `json:"id"`
				Limit int    `json:"limit"`
			}
			gr.JSON(t, &rule)
			if rule.ID != "r2" || rule.Limit != 5 || gr.ETag() != add.ETag() {
				t.Fatalf("GET rule = %s (%s)", gr.Body, gr.ETag())
			}
			expectCode(t, c.Do("GET", "/v1/policies/p/rules/zz", nil), 404, "not_found", "GET unknown rule")
			expectCode(t, c.Do("GET", "/v1/policies/nope/rules/zz", nil), 404, "not_found", "GET rule of unknown policy")
			pr := c.Do("PUT", "/v1/policies/p/rules/r2", ruleDoc("r2", 7), "If-Match", add.ETag())
			expect(t, pr, 200, "PUT rule")
			if p := decodePolicy(t, pr); p.Version != 5 || p.Rules[1].Limit != 7 {
				t.Fatalf("PUT rule → %+v", p)
			}
			expectCode(t, c.Do("PUT", "/v1/policies/p/rules/r2", ruleDoc("r3", 7)), 400, "invalid_document", "PUT rule id mismatch")
			expect(t, c.Do("PUT", "/v1/policies/p/rules/r3", ruleDoc("r3", 8)), 200, "PUT rule upsert")
			dr := c.Do("DELETE", "/v1/policies/p/rules/r3", nil)
			expect(t, dr, 200, "DELETE rule")
			if p := decodePolicy(t, dr); p.Version != 7 || len(p.Rules) != 2 {
				t.Fatalf("DELETE rule → %+v", p)
			}
			expectCode(t, c.Do("DELETE", "/v1/policies/p/rules/r3", nil), 404, "not_found", "DELETE rule again")
			// A rule using "user" needs an identity header: the whole policy is validated.
			expectCode(t, c.Do("POST", "/v1/policies/p/rules", []byte(`{"id":"u","key":["user"],"algorithm":"fixed_window","limit":1,"window":"1m"}`)),
				400, "invalid_document", "POST rule invalid in its policy")

			// List.
			var list struct {
				Policies []struct {
					Policy  string
					Version uint64
					Rules   int
				}
			}
			lr := r.read.Do("GET", "/v1/policies", nil)
			expect(t, lr, 200, "list")
			lr.JSON(t, &list)
			if len(list.Policies) != 2 || list.Policies[0].Policy != "p" || list.Policies[0].Version != 7 || list.Policies[0].Rules != 2 || list.Policies[1].Policy != "q" {
				t.Fatalf("list = %s", lr.Body)
			}

			// History (depth 5: versions 3..7) and rollback.
			var hist struct {
				Current  uint64
				Versions []struct {
					Version uint64
					Actor   string
					Op      string
					Detail  string
				}
			}
			hr := c.Do("GET", "/v1/policies/p/versions", nil)
			expect(t, hr, 200, "versions")
			hr.JSON(t, &hist)
			if hist.Current != 7 || len(hist.Versions) != depth || hist.Versions[0].Version != 7 || hist.Versions[0].Op != "delete_rule" ||
				hist.Versions[3].Op != "add_rule" || hist.Versions[3].Actor != "admin:alice" || hist.Versions[3].Detail != "r2" {
				t.Fatalf("versions = %s", hr.Body)
			}
			expectCode(t, c.Do("GET", "/v1/policies/nope/versions", nil), 404, "not_found", "versions unknown")
			rb := c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":4}`), "X-Sluice-Actor", "bob")
			expect(t, rb, 200, "rollback")
			if p := decodePolicy(t, rb); p.Version != 8 || len(p.Rules) != 2 || p.Rules[1].Limit != 5 {
				t.Fatalf("rollback → %s", rb.Body)
			}
			expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":99}`)), 404, "version_not_found", "rollback future")
			expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":1}`)), 404, "version_expired", "rollback expired")
			expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":0}`)), 400, "invalid_document", "rollback 0")
			expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"v":1}`)), 400, "invalid_document", "rollback bad body")
			expectCode(t, c.Do("POST", "/v1/policies/nope/rollback", []byte(`{"version":1}`)), 404, "not_found", "rollback unknown policy")
			expectCode(t, c.Do("POST", "/v1/policies/p/rollback", []byte(`{"version":4}`), "If-Match", ok.ETag()), 412, "precondition_failed", "rollback stale")

			// Delete; the version counter goes on.
			del := c.Do("DELETE", "/v1/policies/q", nil, "If-Match", qc.ETag())
			expect(t, del, 200, "DELETE policy")
			var d struct {
				Version uint64
				Deleted bool
			}
			del.JSON(t, &d)
			if d.Version != 2 || !d.Deleted {
				t.Fatalf("DELETE → %s", del.Body)
			}
			gone := c.Do("GET", "/v1/policies/q", nil)
			expectCode(t, gone, 404, "not_found", "GET deleted")
			// The 404 of a deleted policy names the deletion, so a filter can
			// tell it from a policy that never existed (which has no tag).
			if tag := gone.Header.Get("ETag"); !strings.HasPrefix(tag, `"v2.`) {
				t.Fatalf("GET deleted: ETag %q, want the deletion's version 2", tag)
			}
			if tag := c.Do("GET", "/v1/policies/never", nil).Header.Get("ETag"); tag != "" {
				t.Fatalf("GET of a policy that never existed: ETag %q", tag)
			}
			expectCode(t, c.Do("DELETE", "/v1/policies/q", nil), 404, "not_found", "DELETE again")
			expectCode(t, c.Do("POST", "/v1/policies/q/rollback", []byte(`{"version":2}`)), 400, "invalid_version", "rollback to deletion")
			// Deleting drops the documents of the history: only the deletion stays.
			expectCode(t, c.Do("POST", "/v1/policies/q/rollback", []byte(`{"version":1}`)), 404, "version_expired", "rollback of a deleted policy")
			back := c.Do("PUT", "/v1/policies/q", policyDoc("q", 1))
			expect(t, back, 201, "PUT re-creates")
			if decodePolicy(t, back).Version != 3 {
				t.Fatalf("re-created %s", back.Body)
			}

			// Methods.
			m := c.Do("PATCH", "/v1/policies/p", []byte(`{}`))
			expectCode(t, m, 405, "method_not_allowed", "PATCH")
			if m.Header.Get("Allow") != "DELETE, GET, PUT" {
				t.Fatalf("Allow = %q", m.Header.Get("Allow"))
			}
			expectCode(t, c.Do("POST", "/healthz", nil), 405, "method_not_allowed", "POST healthz")

			// Metrics.
			mr := r.anon.Do("GET", "/metrics", nil)
			expect(t, mr, 200, "metrics")
			for _, want := range []string{
				`sluice_controlplane_http_requests_total{code="201",method="PUT",route="/v1/policies/{policy}"}`,
				`sluice_controlplane_policy_version{policy="p"} 8`,
				"sluice_controlplane_watchers 0",
				"sluice_controlplane_store_up 1",
				"sluice_controlplane_store_errors_total 0",
				"sluice_controlplane_http_request_duration_seconds_bucket",
			} {
				if !bytes.Contains(mr.Body, []byte(want)) {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

func TestAuth(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	doc := policyDoc("p", 1)
	wrong := *r.admin
	wrong.Token = "nope"

	noTok := r.anon.Do("GET", "/v1/policies/p", nil)
	expectCode(t, noTok, 401, "unauthorized", "no token")
	if !strings.HasPrefix(noTok.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("WWW-Authenticate = %q", noTok.Header.Get("WWW-Authenticate"))
	}
	expectCode(t, r.anon.Do("GET", "/v1/policies/p", nil, "Authorization", "Basic YTpi"), 401, "unauthorized", "basic auth")
	expectCode(t, wrong.Do("GET", "/v1/policies/p", nil), 403, "forbidden", "wrong token")
	expectCode(t, wrong.Do("PUT", "/v1/policies/p", doc), 403, "forbidden", "wrong token write")
	expectCode(t, r.anon.Do("PUT", "/v1/policies/p", doc), 401, "unauthorized", "no token write")
	expectCode(t, r.read.Do("PUT", "/v1/policies/p", doc), 403, "forbidden", "read token write")
	expectCode(t, r.read.Do("DELETE", "/v1/policies/p", nil), 403, "forbidden", "read token delete")
	expect(t, r.admin.Do("PUT", "/v1/policies/p", doc), 201, "admin write")
	expect(t, r.read.Do("GET", "/v1/policies/p", nil), 200, "read token read")
	expect(t, r.read.Do("GET", "/v1/policies/p/versions", nil), 200, "read token versions")
	expect(t, r.admin.Do("GET", "/v1/policies", nil), 200, "admin read")
	expect(t, r.anon.Do("GET", "/v1/policies", nil, "Authorization", "bearer "+readToken), 200, "scheme is case-insensitive")
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		expect(t, r.anon.Do("GET", p, nil), 200, p+" without token")
	}
	var h struct {
		Versions []struct{ Actor string }
	}
	r.read.Do("GET", "/v1/policies/p/versions", nil).JSON(t, &h)
	if h.Versions[0].Actor != "admin" {
		t.Fatalf("actor = %q", h.Versions[0].Actor)
	}
}

func TestNoTokensMeansOpen(t *testing.T) {
	r := startReplica(t, boltBackend(t), func(o *api.Options) { o.AdminToken, o.ReadToken = "", "" })
	expect(t, r.anon.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "write without token")
	expect(t, r.anon.Do("GET", "/v1/policies/p", nil), 200, "read without token")
	var h struct {
		Versions []struct{ Actor string }
	}
	r.anon.Do("GET", "/v1/policies/p/versions", nil, "X-Sluice-Actor", "x").JSON(t, &h)
	if h.Versions[0].Actor != "anonymous" {
		t.Fatalf("actor without auth = %q", h.Versions[0].Actor)
	}
}

// TestErrorBodiesAreJSON: even the router's own answers use the error shape.
func TestErrorBodiesAreJSON(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	for _, tc := range []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/v1/policies/"}, {"GET", "/v1/policies/a/b/c/d"}, {"DELETE", "/v1/policies"},
	} {
		resp := r.admin.Do(tc.method, tc.path, nil)
		var v map[string]json.RawMessage
		resp.JSON(t, &v)
		if _, ok := v["error"]; !ok || (resp.Status != http.StatusNotFound && resp.Status != http.StatusMethodNotAllowed) {
			t.Errorf("%s %s → %d %s", tc.method, tc.path, resp.Status, resp.Body)
		}
	}
}
