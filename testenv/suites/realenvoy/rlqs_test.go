package realenvoy

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/spans"
)

// rlqsLimit is L of rlqsPolicy's rules, per rlqsWindow and per minute.
const (
	rlqsLimit  = 100
	rlqsWindow = 10 * time.Second
)

// rlqsRate and rlqsBurst are the token bucket of rlqsPolicy's /tb/ rule: a
// second's rate and capacity.
const (
	rlqsRate  = 10
	rlqsBurst = 50
)

// rlqsPolicy has four fleet rules per tenant: a fixed window of rlqsLimit per
// rlqsWindow on /q/, per minute on /m/ and per 5 s (one of Envoy's report
// intervals) on /w5/, and a token bucket of rlqsRate a second with a burst of
// rlqsBurst on /tb/. Every request of a test is of one tenant, so each rule is
// one bucket.
var rlqsPolicy = `{"policy":"fleet","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"per-tenant","match":{"path_prefix":"/q/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"` + rlqsWindow.String() + `","scope":"fleet"},` +
	`{"id":"per-tenant-minute","match":{"path_prefix":"/m/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"1m","scope":"fleet"},` +
	`{"id":"per-tenant-5s","match":{"path_prefix":"/w5/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"5s","scope":"fleet"},` +
	`{"id":"per-tenant-bucket","match":{"path_prefix":"/tb/"},"key":["tenant"],"algorithm":"token_bucket",` +
	`"limit":` + strconv.Itoa(rlqsRate) + `,"burst":` + strconv.Itoa(rlqsBurst) + `,"window":"1s","scope":"fleet"}]}`

// TestEnvoysOwnRateLimitQuotaFilterAdmitsNearlyTheLimitAndNeverMore: four real
// Envoys running Envoy's own rate_limit_quota filter, configured by
// `sluicectl envoy-config rlqs` (with the quota token, as docs/rlqs.md says),
// against the control plane's RLQS server, are offered on each rule's one bucket
// at once, until a whole minute has passed: 5×L per window on the 10 s and the
// minute rules, 2×L on the 5 s rule, twice the rate on the token bucket.
// Counted from what the clients got: never more than L admitted in any window,
// and at least 95 % of L in every full 10 s window after the first (which starts
// before any assignment) and in the full minute; on the 5 s rule at least 90 %
// of L in every full window after the first 10 s, and no Envoy admitted nothing
// in two windows in a row; on the token bucket never more than its capacity
// plus its refill over any span of 1 s, 5 s or 30 s, and at least 95 % of its
// rate after the first 10 s. Envoy reports every 5 s: the 5 s windows and the
// token bucket, whose assignments live 2 s at most, are served by the server's
// follow-ups between reports. (Requests are not sent within 30 ms of a window
// edge, so that the client's clock and Envoy's agree on each request's window.)
func TestEnvoysOwnRateLimitQuotaFilterAdmitsNearlyTheLimitAndNeverMore(t *testing.T) {
	envoys := startRLQSEnvoys(t, "rlqs-", rlqsPolicy)

	// From the next 10 s edge until the end of the first whole minute that
	// starts at least 10 s later (the minute bucket warm by then).
	start := time.Now().Truncate(rlqsWindow).Add(2 * rlqsWindow)
	minute := start.Add(rlqsWindow).Add(time.Minute - 1).Truncate(time.Minute)
	// An Envoy reports every 5 s from its first request: each gets its first a
	// quarter of that interval after the one before, so that their reports are
	// spread over it (one falls late in every 5 s window). On the minute rule,
	// before the minute counted.
	for i, e := range envoys {
		time.Sleep(time.Until(start.Add(-rlqsWindow + time.Duration(i)*rlqsclient.EnvoyReportInterval/4)))
		req, _ := http.NewRequest("GET", "http://"+e.Listener+"/m/warm", nil)
		req.Header.Set("X-Tenant-Id", "acme")
		resp, err := fresh.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		resp.Body.Close()
	}
	end := minute.Add(time.Minute)
	tenSecond := offerRLQS(t, envoys, "/q/items", rlqsWindow, 5*rlqsLimit, start, end)
	perMinute := offerRLQS(t, envoys, "/m/items", time.Minute, 5*rlqsLimit, start, end)
	fiveSecond := offerRLQS(t, envoys, "/w5/items", 5*time.Second, 2*rlqsLimit, start, end)
	bucket := offerRLQS(t, envoys, "/tb/items", time.Second, 2*rlqsRate, start, end)
	for _, l := range []*rlqsLoad{tenSecond, perMinute, fiveSecond, bucket} {
		l.wait()
	}

	check := func(what string, w time.Time, n, offered, least int) {
		t.Logf("%s window %s: %d admitted of %d offered (L = %d)", what, w.Format("15:04:05"), n, offered, rlqsLimit)
		if n > rlqsLimit {
			t.Errorf("%s window %s: %d admitted, over L = %d", what, w.Format("15:04:05"), n, rlqsLimit)
		}
		if n < rlqsLimit*least/100 {
			t.Errorf("%s window %s: %d admitted, less than %d %% of L = %d", what, w.Format("15:04:05"), n, least, rlqsLimit)
		}
	}
	for w := start; w.Before(end); w = w.Add(rlqsWindow) {
		check("10 s", w, tenSecond.admitted[w.Unix()], 5*rlqsLimit, percentIf(w.After(start), 95))
	}
	check("1 min", minute, perMinute.admitted[minute.Unix()], 5*rlqsLimit, 95)

	starved := make([]int, len(envoys)) // windows in a row an Envoy got none
	for w := start; w.Before(end); w = w.Add(5 * time.Second) {
		warm := !w.Before(start.Add(rlqsWindow))
		check("5 s", w, fiveSecond.admitted[w.Unix()], 2*rlqsLimit, percentIf(warm, 90))
		for e := range envoys {
			if fiveSecond.byEnvoy[w.Unix()][e] > 0 || !warm {
				starved[e] = 0
				continue
			}
			if starved[e]++; starved[e] > 1 {
				t.Errorf("5 s window %s: %s admitted nothing in %d windows in a row", w.Format("15:04:05"), envoys[e].Name, starved[e])
			}
		}
	}

	times := bucket.times()
	for _, span := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second} {
		if got, most := spans.MostWithin(times, span), rlqsBurst+int(rlqsRate*span/time.Second); got > most {
			t.Errorf("token bucket: %d admitted within %v, over its capacity plus refill %d", got, span, most)
		}
	}
	warm, n := start.Add(rlqsWindow), 0
	for _, at := range times {
		if at >= warm.UnixNano() {
			n++
		}
	}
	rate := float64(n) / end.Sub(warm).Seconds()
	t.Logf("token bucket: %.2f a second admitted past the first 10 s, offered %d (rate %d, burst %d)", rate, 2*rlqsRate, rlqsRate, rlqsBurst)
	if rate < 0.95*rlqsRate {
		t.Errorf("token bucket: %.2f a second admitted, offered twice its rate of %d: want at least 95 %% of it", rate, rlqsRate)
	}
}

// percentIf is p when held, else 0 (a window not held to a lower bound).
func percentIf(held bool, p int) int {
	if held {
		return p
	}
	return 0
}

// rlqsLoad is an offered load in progress: what was admitted per window, by
// the window's start (Unix s), in all and by Envoy, and when.
type rlqsLoad struct {
	wg       sync.WaitGroup
	mu       sync.Mutex
	admitted map[int64]int
	byEnvoy  map[int64][]int
	at       []time.Time // when each admitted request was sent
}

func (l *rlqsLoad) wait() { l.wg.Wait() }

// times returns when the admitted requests were sent (Unix ns), in order.
func (l *rlqsLoad) times() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]int64, len(l.at))
	for i, at := range l.at {
		out[i] = at.UnixNano()
	}
	slices.Sort(out)
	return out
}

// offerRLQS offers offered requests per window of w to path, spread evenly over
// time and over the Envoys, from start until end, counting the admitted per
// window; it returns at once.
func offerRLQS(t *testing.T, envoys []*envoyproc.Envoy, path string, w time.Duration, offered int, start, end time.Time) *rlqsLoad {
	l := &rlqsLoad{admitted: map[int64]int{}, byEnvoy: map[int64][]int{}}
	per := w / time.Duration(offered)
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
			e := i % len(envoys)
			go func(e int, at time.Time) {
				defer l.wg.Done()
				req, _ := http.NewRequest("GET", "http://"+envoys[e].Listener+path, nil)
				req.Header.Set("X-Tenant-Id", "acme")
				resp, err := fresh.Do(req)
				if err != nil {
					t.Errorf("%s: %v", envoys[e].Name, err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					l.mu.Lock()
					win := at.Truncate(w).Unix()
					l.admitted[win]++
					if l.byEnvoy[win] == nil {
						l.byEnvoy[win] = make([]int, len(envoys))
					}
					l.byEnvoy[win][e]++
					l.at = append(l.at, at)
					l.mu.Unlock()
				} else if resp.StatusCode != http.StatusTooManyRequests {
					t.Errorf("%s: status %d", envoys[e].Name, resp.StatusCode)
				}
			}(e, at)
		}
	}()
	return l
}

// startRLQSEnvoys starts a control plane with its gRPC listener (an embedded
// store) holding doc as the policy "fleet", the demo upstream, and four Envoys
// named prefix+i whose rate_limit_quota filter asks it, configured by
// rlqsBootstrap.
func startRLQSEnvoys(t *testing.T, prefix, doc string) []*envoyproc.Envoy {
	t.Helper()
	envoyproc.Binary(t, repo)
	cpAddr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	cp := startProc(t, "control plane", "sluice-controlplane", []string{"--listen", cpAddr, "--grpc-listen", grpcAddr,
		"--data-dir", t.TempDir(), "--log-level", "warn"}, tokens)
	proctest.AwaitHTTP(t, "http://"+cpAddr+"/readyz", readyTimeout, cp)
	proctest.PutPolicy(t, cpAddr, "fleet", adminToken, doc)
	up := startUpstream(t)
	cfgFile := rlqsBootstrap(t, doc, "default", grpcAddr, up)
	var envoys []*envoyproc.Envoy
	for i := 0; i < 4; i++ {
		envoys = append(envoys, envoyproc.Start(t, envoyproc.Options{Name: prefix + strconv.Itoa(i), Root: repo, Config: cfgFile,
			Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
				Clusters: map[string]string{"upstream": up, "sluice_rlqs": grpcAddr}}}))
	}
	return envoys
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
