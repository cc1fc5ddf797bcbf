package realenvoy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// labPolicy's rules decide the same whether a request is timed by its
// access-log START_TIME (milliseconds) or by the filter's clock a moment
// later: windows of an hour and refills of a unit an hour or slower, so no
// window edge or refill falls between the two but once in thousands of
// runs.
const labPolicy = `{"policy":"default","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"rules":[
 {"id":"per-user-hour","match":{"path_prefix":"/a/"},"key":["user"],"algorithm":"fixed_window","limit":3,"window":"1h"},
 {"id":"per-tenant-day","match":{"path_prefix":"/b/"},"key":["tenant"],"algorithm":"token_bucket","limit":10,"window":"24h"},
 {"id":"per-user-pace","match":{"path_prefix":"/c/"},"key":["user"],"algorithm":"gcra","limit":1,"window":"1h","burst":2},
 {"id":"per-user-shadow","key":["user"],"algorithm":"fixed_window","limit":2,"window":"1h","shadow":true}]}`

// sluicectl replay of the real Envoy's access log (and of the dev proxy's),
// with the policy the proxy enforced, decides every request as the proxy did:
// the replay runs the same module on the log's times, so not one request
// differs.
func TestReplayOfTheProxysLogDecidesAsTheProxyDid(t *testing.T) {
	cp := startControlPlane(t, "control plane", "--data-dir", t.TempDir())
	up := startUpstream(t)
	v := proctest.PutPolicy(t, cp.addr, "default", adminToken, labPolicy)
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			p := startProxy(t, kind, proxySpec{name: "lab", config: "envoy/envoy.yaml", upstream: up,
				clusters: map[string]string{"control_plane": cp.addr}})
			replayAgrees(t, p, v)
		})
	}
}

func replayAgrees(t *testing.T, p *proxy, v uint64) {
	awaitVersion(t, p, v)
	// The probes' lines are in the log once the last probe's is.
	before := len(envoyproc.ReadJSONLines(t, p.accessLog))

	denied := 0
	for i := range 240 {
		user, tenant := fmt.Sprintf("user-%d", i%17), fmt.Sprintf("tenant-%d", i%5)
		path := []string{"/a/items", "/b/items", "/c/items"}[i%3]
		r := p.do(t, "GET", path, "X-User-Id", user, "X-Tenant-Id", tenant, "X-Request-Id", fmt.Sprintf("lab-%d", i))
		if r.status == 429 {
			denied++
		}
	}
	if denied == 0 || denied == 240 {
		t.Fatalf("the proxy denied %d of 240: a test of nothing", denied)
	}

	// The log from the first request under the policy on, once it has them all.
	p.logOf(t, "lab-239")
	proctest.WaitFor(10*time.Second, func() bool { return len(envoyproc.ReadJSONLines(t, p.accessLog)) >= before+240 })
	b, err := os.ReadFile(p.accessLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) < before+240 {
		t.Fatalf("the access log has %d lines, want at least %d", len(lines), before+240)
	}
	dir := t.TempDir()
	logFile, polFile := filepath.Join(dir, "access.log"), filepath.Join(dir, "default.json")
	if err := os.WriteFile(logFile, []byte(strings.Join(lines[before:], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(polFile, []byte(labPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), "replay", "--wasm", filepath.Join(binDir, "sluice.wasm"),
		"--policy", polFile, "--log", logFile, "--workers", "2", "-o", "json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl replay: %v\n%s", err, out)
	}
	var rep struct {
		Requests int64
		Denied   int64
		Logged   struct {
			Compared     int64 `json:"compared"`
			NewlyDenied  int64 `json:"newly_denied"`
			NewlyAllowed int64 `json:"newly_allowed"`
		} `json:"against_log"`
		Rules []struct {
			ID           string
			Denied       int64
			ShadowDenied int64 `json:"shadow_denied"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Logged.Compared != rep.Requests || rep.Requests < 240 {
		t.Fatalf("compared %d of %d requests\n%s", rep.Logged.Compared, rep.Requests, out)
	}
	if rep.Logged.NewlyDenied != 0 || rep.Logged.NewlyAllowed != 0 || rep.Denied != int64(denied) {
		t.Fatalf("the replay decided differently from the proxy: %d newly denied, %d newly allowed, %d denied (the proxy: %d)\n%s",
			rep.Logged.NewlyDenied, rep.Logged.NewlyAllowed, rep.Denied, denied, out)
	}
	for _, r := range rep.Rules {
		if r.Denied == 0 && r.ShadowDenied == 0 {
			t.Errorf("rule %s denied nothing in the replay: the test does not reach it\n%s", r.ID, out)
		}
	}
	t.Logf("%s: %d requests replayed, %d denied, as the proxy decided", p.name, rep.Requests, rep.Denied)
}
