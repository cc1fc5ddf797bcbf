package realenvoy

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// rlqsLimit is L of rlqsPolicy's one rule, per rlqsWindow.
const (
	rlqsLimit  = 100
	rlqsWindow = 10 * time.Second
)

// rlqsPolicy is one fleet rule, a fixed window of rlqsLimit per rlqsWindow on
// /q/ per tenant: every request of the test is of one tenant, one bucket.
var rlqsPolicy = `{"policy":"fleet","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"per-tenant","match":{"path_prefix":"/q/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"` + rlqsWindow.String() + `","scope":"fleet"}]}`

// TestEnvoysOwnRateLimitQuotaFilterNeverAdmitsPastTheLimit: four real Envoys
// running Envoy's own rate_limit_quota filter, configured by
// `sluicectl envoy-config rlqs` (with the quota token, as docs/rlqs.md says),
// against the control plane's RLQS server, are offered 5×L per window on one
// bucket for three full windows. Counted per window from what the clients
// got: never more than L admitted in any window, and some admitted. (Requests
// are not sent within 30 ms of a window edge, so that the client's clock and
// Envoy's agree on each request's window.)
func TestEnvoysOwnRateLimitQuotaFilterNeverAdmitsPastTheLimit(t *testing.T) {
	envoyproc.Binary(t, repo)
	cpAddr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	cp := startProc(t, "control plane", "sluice-controlplane", []string{"--listen", cpAddr, "--grpc-listen", grpcAddr,
		"--data-dir", t.TempDir(), "--log-level", "warn"}, tokens)
	proctest.AwaitHTTP(t, "http://"+cpAddr+"/readyz", readyTimeout, cp)
	proctest.PutPolicy(t, cpAddr, "fleet", adminToken, rlqsPolicy)
	up := startUpstream(t)

	cfgFile := rlqsBootstrap(t, rlqsPolicy, "default", grpcAddr, up)
	var envoys []*envoyproc.Envoy
	for i := 0; i < 4; i++ {
		envoys = append(envoys, envoyproc.Start(t, envoyproc.Options{Name: "rlqs-" + strconv.Itoa(i), Root: repo, Config: cfgFile,
			Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
				Clusters: map[string]string{"upstream": up, "sluice_rlqs": grpcAddr}}}))
	}

	// Start at the next window edge, then offer 5×L a window, spread evenly
	// over the four Envoys, for three full windows.
	per := rlqsWindow / (5 * rlqsLimit)
	start := time.Now().Truncate(rlqsWindow).Add(rlqsWindow)
	time.Sleep(time.Until(start))
	admitted := map[int64]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 3*5*rlqsLimit; i++ {
		at := start.Add(time.Duration(i) * per)
		if off := at.Sub(at.Truncate(rlqsWindow)); off < 30*time.Millisecond || rlqsWindow-off < 30*time.Millisecond {
			continue
		}
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func(e *envoyproc.Envoy, at time.Time) {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://"+e.Listener+"/q/items", nil)
			req.Header.Set("X-Tenant-Id", "acme")
			resp, err := fresh.Do(req)
			if err != nil {
				t.Errorf("%s: %v", e.Name, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				mu.Lock()
				admitted[at.Truncate(rlqsWindow).Unix()]++
				mu.Unlock()
			} else if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("%s: status %d", e.Name, resp.StatusCode)
			}
		}(envoys[i%4], at)
	}
	wg.Wait()
	total := 0
	for w := start; w.Before(start.Add(3 * rlqsWindow)); w = w.Add(rlqsWindow) {
		n := admitted[w.Unix()]
		total += n
		t.Logf("window %s: %d admitted of %d offered (L = %d)", w.Format("15:04:05"), n, 5*rlqsLimit, rlqsLimit)
		if n > rlqsLimit {
			t.Errorf("window %s: %d admitted, over L = %d", w.Format("15:04:05"), n, rlqsLimit)
		}
	}
	if total == 0 {
		t.Error("nothing admitted in three windows: Envoy never got an assignment")
	}
}

// rlqsBootstrap writes the bootstrap `sluicectl envoy-config rlqs` generates for
// the policy doc (its counter keys in env, the quota service at grpcAddr, the
// service at up), with the quota token in its environment as docs/rlqs.md says,
// and returns its path.
func rlqsBootstrap(t *testing.T, doc, env, grpcAddr, up string) string {
	t.Helper()
	dir := t.TempDir()
	polFile, cfgFile := filepath.Join(dir, "policy.json"), filepath.Join(dir, "envoy-rlqs.yaml")
	if err := os.WriteFile(polFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), "envoy-config", "rlqs", "-f", polFile, "--env", env, "--grpc", grpcAddr, "--upstream", up)
	cmd.Env = append(os.Environ(), "SLUICE_QUOTA_TOKEN="+quotaToken)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl envoy-config rlqs: %v", err)
	}
	if err := os.WriteFile(cfgFile, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgFile
}
