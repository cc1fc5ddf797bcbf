package realenvoy

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqstest"
)

// TestTheShippedBootstrapThroughAControlPlaneOutage runs envoy/envoy.yaml as
// shipped (addresses rewritten), 2 workers, the tokens from the proxy's own
// environment, through the life of a deployment, in the real Envoy and in the
// dev proxy alike:
//   - started before its control plane: requests pass (fail_mode open, reason
//     no_policy) and the failed polls are counted;
//   - the control plane comes up with the demo policy: it is enforced, and
//     every series the Grafana dashboard and the alert rules read is served
//     (the proxy's /stats/prometheus under Envoy's own names, the control
//     plane's /metrics);
//   - a rule change is in force without a restart, through the long poll;
//   - the control plane is killed: the last good policy stays in force.
func TestTheShippedBootstrapThroughAControlPlaneOutage(t *testing.T) {
	up := startUpstream(t)
	demo, err := os.ReadFile(filepath.Join(repo, "examples", "default-policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			cpAddr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
			p := startProxy(t, kind, proxySpec{name: "outage", config: "envoy/envoy.yaml", upstream: up,
				clusters: map[string]string{"control_plane": cpAddr}})

			// 1. No control plane yet.
			r := p.do(t, "GET", "/api/hello", "X-User-Id", "early", "X-Request-Id", "early")
			if r.status != http.StatusOK {
				t.Fatalf("before any policy: %d, want 200 (fail_mode open)", r.status)
			}
			if f := rateLimitOf(t, p, "early"); f["reason"] != "no_policy" {
				t.Errorf("before any policy: rate_limit %v, want reason no_policy", f)
			}
			if !proctest.WaitFor(30*time.Second, func() bool {
				return regexp.MustCompile(`(?m)^sluice_policy_sync_failures\w*\{\} [1-9]`).MatchString(p.prometheus(t))
			}) {
				t.Fatalf("no failed poll counted as sluice_policy_sync_failures:\n%s", p.prometheus(t))
			}

			// 2. The control plane, the demo policy, traffic through every kind of rule.
			cp := startProc(t, "control plane", "sluice-controlplane", []string{"--listen", cpAddr, "--grpc-listen", grpcAddr,
				"--data-dir", t.TempDir(), "--log-level", "warn"}, tokens)
			proctest.AwaitHTTP(t, "http://"+cpAddr+"/readyz", readyTimeout, cp)
			v1 := proctest.PutPolicy(t, cpAddr, "default", adminToken, string(demo))
			awaitVersion(t, p, v1)
			for i := 0; i < 12; i++ {
				for _, path := range []string{"/api/x", "/admin", "/fleet/x", "/search", "/export"} {
					p.do(t, "GET", path, "X-User-Id", "monitoring-demo")
				}
			}
			rlqstest.Report(t, grpcAddr, quotaToken, "rlqs-demo")
			if !proctest.WaitFor(10*time.Second, func() bool {
				return regexp.MustCompile(`(?m)^sluice_rule_api_per_user_limited\{\} [1-9]`).MatchString(p.prometheus(t))
			}) {
				t.Fatalf("the limited requests were never counted:\n%s", p.prometheus(t))
			}
			served := proctest.ServedSeries(t, "http://"+cpAddr+"/metrics", "http://"+p.admin+"/stats/prometheus")
			t.Logf("%d dashboard and alert series, all served", proctest.CheckDashboardSeries(t, repo, served))

			// 3. A rule change, in force without a restart.
			raised := strings.Replace(string(demo), `"limit": 5,`, `"limit": 100,`, 1)
			v2 := proctest.PutPolicy(t, cpAddr, "default", adminToken, raised)
			took := awaitVersion(t, p, v2)
			t.Logf("policy v%d decided %v after the PUT's answer", v2, took.Round(time.Millisecond))
			// The filter's long poll waits 30 s (envoy.yaml "wait"): a change
			// that arrives well before that was pushed through the open poll,
			// not found by a later one.
			if took > 10*time.Second {
				t.Errorf("the change took %v: the long poll did not return on the change", took)
			}
			if f := rateLimitOf(t, p, "raised", "GET", "/api/hello", "X-User-Id", "raised"); f["limit"] != "100" {
				t.Errorf("after the change: rate_limit %v, want limit 100", f)
			}

			// 4. The control plane dies: the last good policy stays.
			cp.Kill()
			for i := 0; i < 3; i++ {
				id := fmt.Sprintf("after-kill-%d", i)
				f := rateLimitOf(t, p, id, "GET", "/api/hello", "X-User-Id", "after-kill")
				if f["policy_version"] != fmt.Sprint(v2) || f["limit"] != "100" {
					t.Errorf("with the control plane gone: rate_limit %v, want policy_version %d, limit 100", f, v2)
				}
			}
		})
	}
}

// rateLimitOf returns the rate_limit fields of the access-log line of the
// request with x-request-id id; with more arguments (method, path, then
// header pairs) it first sends that request with that id.
func rateLimitOf(t *testing.T, p *proxy, id string, req ...string) map[string]string {
	t.Helper()
	if len(req) >= 2 {
		p.do(t, req[0], req[1], append([]string{"X-Request-Id", id}, req[2:]...)...)
	}
	f, err := filterstate.FromLogLine(p.logOf(t, id))
	if err != nil {
		t.Fatal(err)
	}
	return f
}
