package realenvoy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// step is one request of the walkthrough and the demo table.
type step struct {
	method, path string
	kv           []string // headers, name value pairs; USER in a value is replaced per proxy
}

// demoSteps are the README walkthrough's requests (steps 1, 2 and 6) and
// one or more per rule of the demo table, in order: every rule admits, then
// limits (the shadow rule only logs), the exempt user passes, and a path no
// rule matches passes undecided.
func demoSteps() []step {
	var s []step
	add := func(n int, method, path string, kv ...string) {
		for i := 0; i < n; i++ {
			s = append(s, step{method, path, kv})
		}
	}
	add(9, "GET", "/api/hello", "X-User-Id", "alice-USER")
	add(7, "GET", "/api/x", "X-User-Id", "ops-bot")
	add(4, "POST", "/login")
	add(4, "GET", "/reports", "X-Tenant-Id", "acme-USER")
	add(2, "GET", "/reports")
	add(3, "GET", "/export", "X-User-Id", "eve-USER")
	add(2, "GET", "/admin")
	add(12, "GET", "/fleet/hello", "X-User-Id", "fay-USER")
	add(1, "GET", "/elsewhere?q=1", "X-User-Id", "alice-USER")
	return s
}

// observed is what one step gave: the response and its access-log line,
// normalized for comparison (see normalize).
type observed struct {
	Status int
	Header map[string]string
	Body   any
	Log    map[string]any
	Limit  map[string]string // rate_limit's fields
}

// TestTheWalkthroughAnswersTheSameInEnvoyAndTheDevProxy: the README's
// walkthrough requests and a trip of every demo rule, through the real Envoy
// and through the dev proxy, both on envoy/envoy.yaml as shipped (addresses
// rewritten) against one control plane holding examples/default-policy.json,
// give the same statuses, response headers, bodies (local replies and what the
// upstream received) and access-log lines, but for times, the listener port
// and the per-proxy user names. A difference is a defect of the dev proxy or
// the wazero host.
func TestTheWalkthroughAnswersTheSameInEnvoyAndTheDevProxy(t *testing.T) {
	cp := startControlPlane(t, "control plane", "--data-dir", t.TempDir())
	up := startUpstream(t)
	demo, err := os.ReadFile(filepath.Join(repo, "examples", "default-policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	v := proctest.PutPolicy(t, cp.addr, "default", adminToken, string(demo))
	got := map[string][]observed{}
	for _, kind := range kinds {
		p := startProxy(t, kind, proxySpec{name: "walkthrough", config: "envoy/envoy.yaml", upstream: up,
			clusters: map[string]string{"control_plane": cp.addr}})
		awaitVersion(t, p, v)
		tag := "u" + strconv.Itoa(len(got)) // the proxy's users: alice-u0, alice-u1
		for i, s := range demoSteps() {
			id := fmt.Sprintf("step-%d", i)
			kv := append([]string{"X-Request-Id", id}, s.kv...)
			for j := range kv {
				kv[j] = strings.ReplaceAll(kv[j], "USER", tag)
			}
			r := p.do(t, s.method, s.path, kv...)
			got[kind] = append(got[kind], normalize(t, tag, p, r, p.logOf(t, id)))
		}
	}
	steps := demoSteps()
	for i := range steps {
		e, d := got[envoyKind][i], got[devProxyKind][i]
		if !reflect.DeepEqual(e, d) {
			t.Errorf("step %d (%s %s): Envoy and the dev proxy differ:\n%s", i, steps[i].method, steps[i].path, differences(e, d))
		}
	}
	// The answers are the ones the README promises, not merely equal.
	var statuses []int
	for _, o := range got[envoyKind][:9] {
		statuses = append(statuses, o.Status)
	}
	if fmt.Sprint(statuses) != "[200 200 200 200 200 429 429 429 429]" {
		t.Errorf("api-per-user in Envoy: %v, want five 200s then 429s", statuses)
	}
	limited := got[envoyKind][5]
	for _, h := range []string{"retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "content-type"} {
		if limited.Header[h] == "" {
			t.Errorf("Envoy's 429 lacks %s: %v", h, limited.Header)
		}
	}
	if limited.Limit["rate_limited"] != "true" || limited.Limit["rule"] != "api-per-user" || limited.Log["status_code"] != 429.0 {
		t.Errorf("Envoy's access log for the 429: %v", limited.Log)
	}
	fleet := 0
	for _, o := range got[envoyKind][31:43] {
		if o.Status == http.StatusOK {
			fleet++
		}
	}
	if fleet != 10 {
		t.Errorf("fleet-per-user in Envoy admitted %d of 12, want 10", fleet)
	}
}

// normalize keeps what both proxies must agree on (for a fleet rule, not the
// lease's quota and remaining, which follow the worker a request landed on):
// header names lower-cased
// (Go's server writes them canonical, Envoy lower-case; HTTP does not
// care), without date and the measured x-envoy-upstream-service-time; a JSON
// body decoded, with the local reply's timestamp and the upstream's "host"
// (the listener's port) dropped; the access-log line without timestamp and
// response_time_ms; rate_limit's fields without reset (a second boundary may
// fall between the two runs). The per-proxy user suffix is removed throughout.
func normalize(t *testing.T, tag string, p *proxy, r response, line map[string]any) observed {
	t.Helper()
	strip := func(s string) string { return strings.ReplaceAll(s, "-"+tag, "") }
	o := observed{Status: r.status, Header: map[string]string{}, Log: map[string]any{}}
	for k, vs := range r.header {
		k = strings.ToLower(k)
		switch k {
		case "date", "x-envoy-upstream-service-time", "x-ratelimit-reset", "retry-after", "content-length":
			// content-length follows the body, compared below; the two reset
			// headers count seconds and may straddle one.
			o.Header[k] = "present"
		default:
			o.Header[k] = strip(strings.Join(vs, ","))
		}
	}
	var body map[string]any
	if json.Unmarshal(r.body, &body) == nil {
		delete(body, "timestamp")
		delete(body, "host")
		if d, ok := body["data"].(map[string]any); ok {
			delete(d, "reset")
		}
		if h, ok := body["headers"].(map[string]any); ok {
			for k, v := range h {
				delete(h, k)
				h[strings.ToLower(k)] = v
			}
		}
		b, _ := json.Marshal(body)
		_ = json.Unmarshal([]byte(strip(string(b))), &o.Body)
	} else {
		o.Body = strip(string(r.body))
	}
	for k, v := range line {
		switch k {
		case "timestamp", "response_time_ms", filterstate.LogField:
		default:
			if s, ok := v.(string); ok {
				v = strip(s)
			}
			o.Log[k] = v
		}
	}
	f, err := filterstate.FromLogLine(line)
	if err != nil {
		t.Fatalf("%s: %v in %v", p.name, err, line)
	}
	delete(f, "reset")
	if f["scope"] == "fleet" {
		// Whether a fleet request waited for a lease or spent one a worker
		// already held, and what that lease has left, depends on which worker
		// the connection landed on: the kernel spreads them in Envoy, the dev
		// proxy takes turns. The decision itself (status, rule, limit) is compared.
		delete(f, "quota")
		delete(f, "remaining")
	}
	for k, v := range f {
		f[k] = strip(v)
	}
	o.Limit = f
	return o
}

// probePath is matched by the demo's reports-per-tenant-day rule, which does
// not count a request without x-tenant-id: the filter decides it under the
// policy in use and logs the version without charging anything.
const probePath = "/reports/probe"

// awaitVersion sends probes on new connections until 8 in a row were decided
// under policy version v (rate_limit's policy_version in the access log), so
// that with 2 workers each has almost surely shown it; it fails the test
// after 30 s. It returns how long after its call the first probe decided
// under v was sent (the wait for the access log's flush is not counted).
func awaitVersion(t testing.TB, p *proxy, v uint64) time.Duration {
	t.Helper()
	start := time.Now()
	var first time.Duration
	want, n, run := strconv.FormatUint(v, 10), 0, 0
	ok := proctest.WaitFor(30*time.Second, func() bool {
		for {
			n++
			id := fmt.Sprintf("probe-%d-%d", v, n)
			sent := time.Since(start)
			p.do(t, "GET", probePath, "X-Request-Id", id)
			f, _ := filterstate.FromLogLine(p.logOf(t, id))
			if f["policy_version"] != want {
				run = 0
				return false
			}
			if run == 0 {
				first = sent
			}
			if run++; run >= 8 {
				return true
			}
		}
	})
	if !ok {
		t.Fatalf("%s did not decide under policy version %d within 30s", p.name, v)
	}
	return first
}

// differences lists, one per line, the leaves in which e (Envoy) and d (the
// dev proxy) differ, as "path: envoy value | dev proxy value".
func differences(e, d observed) string {
	var flat func(prefix string, v any, out map[string]string)
	flat = func(prefix string, v any, out map[string]string) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				flat(prefix+"."+k, c, out)
			}
		default:
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		}
	}
	tree := func(o observed) map[string]string {
		var m map[string]any
		b, _ := json.Marshal(o)
		_ = json.Unmarshal(b, &m)
		out := map[string]string{}
		flat("", m, out)
		return out
	}
	em, dm := tree(e), tree(d)
	keys := map[string]bool{}
	for k := range em {
		keys[k] = true
	}
	for k := range dm {
		keys[k] = true
	}
	var lines []string
	for k := range keys {
		if em[k] != dm[k] {
			lines = append(lines, "  "+k+": "+em[k]+" | "+dm[k])
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
