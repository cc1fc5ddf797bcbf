package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqstest"
)

// TestEverySeriesTheDashboardAndAlertsReadIsServed: after a short demo (a dev
// proxy started before its control plane, so that its first polls and quota calls
// fail; the demo policy; requests through every kind of rule; one RLQS report),
// every series the Grafana dashboard and the alert rules select is served, by the
// control plane's /metrics or by the dev proxy's admin /stats/prometheus under the
// name Envoy gives it there. A panel or alert that names a series nothing serves
// would stay empty, or never fire.
func TestEverySeriesTheDashboardAndAlertsReadIsServed(t *testing.T) {
	cp, grpcAddr, admin, proxy := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	up := proctest.FreeAddr(t)
	echo := startProc(t, "upstream", filepath.Join(binDir, "sluice-echo"), []string{"--listen", up}, nil)
	proctest.AwaitHTTP(t, "http://"+up+"/", readyTimeout, echo)
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	dp := startProc(t, "dev proxy", filepath.Join(binDir, "sluice-devproxy"), []string{"--config", "envoy/envoy.yaml",
		"--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", proxy, "--upstream", up, "--cluster", "control_plane=" + cp,
		"--admin", admin, "--access-log", filepath.Join(t.TempDir(), "access.log"), "--workers", "2", "--log-level", "warn"}, tokens)
	proctest.AwaitHTTP(t, "http://"+admin+"/ready", listenTimeout, dp)
	get := func(url string) string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Before the control plane is up: the filter's polls fail.
	if !proctest.WaitFor(30*time.Second, func() bool {
		return regexp.MustCompile(`(?m)^sluice_policy_sync_failures\w*\{\} [1-9]`).MatchString(get("http://" + admin + "/stats/prometheus"))
	}) {
		t.Fatalf("no failed poll counted:\n%s", get("http://"+admin+"/stats/prometheus"))
	}
	cpp := startProc(t, "control plane", filepath.Join(binDir, "sluice-controlplane"), []string{"--listen", cp, "--grpc-listen", grpcAddr,
		"--data-dir", t.TempDir(), "--log-level", "warn"}, tokens)
	proctest.AwaitHTTP(t, "http://"+cp+"/readyz", readyTimeout, cpp)
	demo, err := os.ReadFile(filepath.Join(repo, "examples", "default-policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	v := proctest.PutPolicy(t, cp, "default", adminToken, string(demo))
	if !proctest.WaitFor(40*time.Second, func() bool {
		return regexp.MustCompile(`(?m)^sluice_policy_version\{\} ` + strconv.FormatUint(v, 10) + `$`).MatchString(get("http://" + admin + "/stats/prometheus"))
	}) {
		t.Fatalf("the dev proxy never reported policy version %d:\n%s", v, get("http://"+admin+"/stats/prometheus"))
	}
	// The demo: every kind of rule, allowed and limited.
	for i := 0; i < 12; i++ {
		for _, path := range []string{"/api/x", "/admin", "/fleet/x", "/search", "/export"} {
			req, _ := http.NewRequest("GET", "http://"+proxy+path, nil)
			req.Header.Set("X-User-Id", "monitoring-demo")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
	rlqstest.Report(t, grpcAddr, quotaToken, "rlqs-demo")

	served := proctest.ServedSeries(t, "http://"+cp+"/metrics", "http://"+admin+"/stats/prometheus")
	checked := proctest.CheckDashboardSeries(t, repo, served)
	t.Logf("%d series, all served (%d names served)", checked, len(served))
}
