package realenvoy

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// mixedPolicy is rlqsPolicy's rule as the policy the Wasm filter of
// envoy/envoy.yaml pulls ("default"), with a probe rule for awaitVersion.
var mixedPolicy = `{"policy":"default","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"probe","match":{"path_prefix":"/reports/"},"key":["tenant"],"algorithm":"fixed_window","limit":1,"window":"1h"},` +
	`{"id":"per-tenant","match":{"path_prefix":"/q/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"` + rlqsWindow.String() + `","scope":"fleet"}]}`

// TestWasmAndRateLimitQuotaEnvoysShareOneLimit: two real Envoys running Envoy's own
// rate_limit_quota filter and two running the sluice Wasm filter spend one fleet
// key through two control planes on one Redis (append-only, fsync always): offered
// 5×L a window, half by each kind, never more than L is admitted in a window, and
// each kind is admitted (shares by demand; over the run, not in every window:
// RLQS Envoys whose 5 s reports land late in a 10 s window can get nothing in
// it, docs/rlqs.md). The control plane the
// RLQS Envoys stream to is killed (SIGKILL) and started again mid-run: their
// streams are cut and reopened, and the windows still hold L.
func TestWasmAndRateLimitQuotaEnvoysShareOneLimit(t *testing.T) {
	envoyproc.Binary(t, repo)
	redis := redisproc.Start(t, redisproc.Options{AppendOnly: true})
	grpcAddr := proctest.FreeAddr(t)
	var cps []*controlPlane
	for i := 0; i < 2; i++ {
		extra := []string{"--redis-url", redis.URL(), "--resync-interval", "200ms"}
		if i == 1 {
			extra = append(extra, "--grpc-listen", grpcAddr)
		}
		cps = append(cps, startControlPlane(t, "control plane "+strconv.Itoa(i), extra...))
	}
	v := proctest.PutPolicy(t, cps[0].addr, "default", adminToken, mixedPolicy)
	up := startUpstream(t)

	// Envoy's own filter, configured as docs/rlqs.md says.
	cfgFile := rlqsBootstrap(t, mixedPolicy, "dev", grpcAddr, up)
	var rlqsAddrs, wasmAddrs []string
	for i := 0; i < 2; i++ {
		e := envoyproc.Start(t, envoyproc.Options{Name: "rlqs-" + strconv.Itoa(i), Root: repo, Config: cfgFile,
			Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
				Clusters: map[string]string{"upstream": up, "sluice_rlqs": grpcAddr}}})
		rlqsAddrs = append(rlqsAddrs, e.Listener)
		p := startProxy(t, envoyKind, proxySpec{name: "wasm-" + strconv.Itoa(i), config: "envoy/envoy.yaml", upstream: up,
			clusters: map[string]string{"control_plane": cps[0].addr}})
		awaitVersion(t, p, v)
		wasmAddrs = append(wasmAddrs, p.addr)
	}

	// Four full windows, the RLQS control plane killed and restarted in the second.
	per := rlqsWindow / (5 * rlqsLimit)
	start := time.Now().Truncate(rlqsWindow).Add(rlqsWindow)
	time.Sleep(time.Until(start))
	type tally struct{ rlqs, wasm int }
	admitted := map[int64]*tally{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	restarted := false
	for i := 0; i < 4*5*rlqsLimit; i++ {
		at := start.Add(time.Duration(i) * per)
		if off := at.Sub(at.Truncate(rlqsWindow)); off < 30*time.Millisecond || rlqsWindow-off < 30*time.Millisecond {
			continue
		}
		time.Sleep(time.Until(at))
		if !restarted && at.Sub(start) > rlqsWindow+rlqsWindow/3 {
			restarted = true
			cps[1].Kill()
			cps[1].Start()
		}
		kind, addr := "wasm", wasmAddrs[(i/2)%2]
		if i%2 == 0 {
			kind, addr = "rlqs", rlqsAddrs[(i/2)%2]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://"+addr+"/q/items", nil)
			req.Header.Set("X-Tenant-Id", "acme")
			resp, err := fresh.Do(req)
			if err != nil {
				t.Errorf("%s %s: %v", kind, addr, err)
				return
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				mu.Lock()
				w := at.Truncate(rlqsWindow).Unix()
				if admitted[w] == nil {
					admitted[w] = &tally{}
				}
				if kind == "rlqs" {
					admitted[w].rlqs++
				} else {
					admitted[w].wasm++
				}
				mu.Unlock()
			case http.StatusTooManyRequests:
			default:
				t.Errorf("%s %s: status %d", kind, addr, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	var total tally
	for w := start; w.Before(start.Add(4 * rlqsWindow)); w = w.Add(rlqsWindow) {
		a := admitted[w.Unix()]
		if a == nil {
			a = &tally{}
		}
		t.Logf("window %s: %d admitted through RLQS Envoys, %d through Wasm Envoys (L = %d, %d offered)",
			w.Format("15:04:05"), a.rlqs, a.wasm, rlqsLimit, 5*rlqsLimit)
		if a.rlqs+a.wasm > rlqsLimit {
			t.Errorf("window %s: %d admitted, over L = %d", w.Format("15:04:05"), a.rlqs+a.wasm, rlqsLimit)
		}
		total.rlqs += a.rlqs
		total.wasm += a.wasm
	}
	if total.rlqs == 0 || total.wasm == 0 {
		t.Errorf("a kind of Envoy got nothing in four windows (rlqs %d, wasm %d) while the other was admitted", total.rlqs, total.wasm)
	}
}
