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

// rlqsLimit is L of rlqsPolicy's rules, per rlqsWindow and per minute.
const (
	rlqsLimit  = 100
	rlqsWindow = 10 * time.Second
)

// rlqsPolicy has two fleet rules, each a fixed window of rlqsLimit per tenant:
// per rlqsWindow on /q/, per minute on /m/. Every request of a test is of one
// tenant, so each rule is one bucket.
var rlqsPolicy = `{"policy":"fleet","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"per-tenant","match":{"path_prefix":"/q/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"` + rlqsWindow.String() + `","scope":"fleet"},` +
	`{"id":"per-tenant-minute","match":{"path_prefix":"/m/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"1m","scope":"fleet"}]}`

// TestEnvoysOwnRateLimitQuotaFilterAdmitsNearlyTheLimitAndNeverMore: four real
// Envoys running Envoy's own rate_limit_quota filter, configured by
// `sluicectl envoy-config rlqs` (with the quota token, as docs/rlqs.md says),
// against the control plane's RLQS server, are offered 5×L per window on each
// rule's one bucket, the 10 s rule and the minute rule at once, until a whole
// minute has passed. Counted per window from what the clients got: never more
// than L admitted in any window, and at least 95 % of L in every full window
// after the first 10 s one (which starts before any assignment) and in the
// full minute. (Requests are not sent within 30 ms of a window edge, so that the
// client's clock and Envoy's agree on each request's window.)
func TestEnvoysOwnRateLimitQuotaFilterAdmitsNearlyTheLimitAndNeverMore(t *testing.T) {
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

	// From the next 10 s edge until the end of the first whole minute that
	// starts at least 10 s later (the minute bucket warm by then).
	start := time.Now().Truncate(rlqsWindow).Add(rlqsWindow)
	minute := start.Add(rlqsWindow).Add(time.Minute - 1).Truncate(time.Minute)
	end := minute.Add(time.Minute)
	tenSecond := offerRLQS(t, envoys, "/q/items", rlqsWindow, start, end)
	perMinute := offerRLQS(t, envoys, "/m/items", time.Minute, start, end)
	tenSecond.wait()
	perMinute.wait()

	check := func(what string, w time.Time, n int, full bool) {
		t.Logf("%s window %s: %d admitted of %d offered (L = %d)", what, w.Format("15:04:05"), n, 5*rlqsLimit, rlqsLimit)
		if n > rlqsLimit {
			t.Errorf("%s window %s: %d admitted, over L = %d", what, w.Format("15:04:05"), n, rlqsLimit)
		}
		if full && n < rlqsLimit*95/100 {
			t.Errorf("%s window %s: %d admitted, less than 95 %% of L = %d", what, w.Format("15:04:05"), n, rlqsLimit)
		}
	}
	for w := start; w.Before(end); w = w.Add(rlqsWindow) {
		check("10 s", w, tenSecond.admitted[w.Unix()], w.After(start))
	}
	check("1 min", minute, perMinute.admitted[minute.Unix()], true)
}

// rlqsLoad is an offered load in progress: what was admitted per window.
type rlqsLoad struct {
	wg       sync.WaitGroup
	mu       sync.Mutex
	admitted map[int64]int // by the window's start, Unix s
}

func (l *rlqsLoad) wait() { l.wg.Wait() }

// offerRLQS offers 5×L per window of w to path, spread evenly over time and over
// the Envoys, from start until end, counting the admitted per window; it returns
// at once.
func offerRLQS(t *testing.T, envoys []*envoyproc.Envoy, path string, w time.Duration, start, end time.Time) *rlqsLoad {
	l := &rlqsLoad{admitted: map[int64]int{}}
	per := w / (5 * rlqsLimit)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i) * per)
			if !at.Before(end) {
				return
			}
			if off := at.Sub(at.Truncate(w)); off < 30*time.Millisecond || w-off < 30*time.Millisecond {
				continue
			}
			time.Sleep(time.Until(at))
			l.wg.Add(1)
			go func(e *envoyproc.Envoy, at time.Time) {
				defer l.wg.Done()
				req, _ := http.NewRequest("GET", "http://"+e.Listener+path, nil)
				req.Header.Set("X-Tenant-Id", "acme")
				resp, err := fresh.Do(req)
				if err != nil {
					t.Errorf("%s: %v", e.Name, err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					l.mu.Lock()
					l.admitted[at.Truncate(w).Unix()]++
					l.mu.Unlock()
				} else if resp.StatusCode != http.StatusTooManyRequests {
					t.Errorf("%s: status %d", e.Name, resp.StatusCode)
				}
			}(envoys[i%len(envoys)], at)
		}
	}()
	return l
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
