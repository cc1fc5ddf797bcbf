package fleettorture

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqstest"
)

// The mixed fleet: Wasm Envoys and Envoys of the rate_limit_quota kind on one
// fleet key of a rule that, cut off from the quota service, enforces each Envoy's
// share locally (on_quota_failure "local").
const (
	mixedLimit  = 300
	mixedWindow = 10 * time.Second
	mixedWasm   = 4
	mixedRLQS   = 3
)

var mixedPolicy = `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"shared","match":{"path_prefix":"/shared"},"key":["user"],"algorithm":"fixed_window","limit":` + strconv.Itoa(mixedLimit) +
	`,"window":"10s","scope":"fleet","on_quota_failure":"local"}]}`

// cutGate is a reverse proxy in front of a control plane that, while cut, answers
// every call 503 as an Envoy's cluster does when its upstream is unreachable.
type cutGate struct {
	srv *httptest.Server
	cut atomic.Bool
}

func newCutGate(t *testing.T, target string) *cutGate {
	g := &cutGate{}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.cut.Load() {
			http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// mixedResult is one request of the mixed load.
type mixedResult struct {
	envoy      int
	status     int
	degraded   bool
	sent, recv int64
}

// TestMixedFleetKeepsItsLimitThroughOutages: 4 Wasm Envoys and 3 Envoys running
// Envoy's rate_limit_quota filter (reporting every 5 s, as Envoy does), over two
// replicas on one redis-server, spend one user's key (2 KB long) of a fleet rule
// of 300 per 10 s with on_quota_failure "local", offered twice that. Counted per
// window: at most L while every part is up; while one Wasm Envoy is cut off from
// the control plane, at most L plus that Envoy's local share (L/n for the n
// Envoys the service said share the key, plus the one request a window always
// passes); in the window Redis is frozen whole, at most L (each Wasm Envoy
// admits its share locally, the RLQS Envoys deny on their expired behaviour); in
// the windows the freeze begins and ends, at most 2 L (the documented bound:
// leases and local shares side by side).
func TestMixedFleetKeepsItsLimitThroughOutages(t *testing.T) {
	if testing.Short() {
		t.Skip("the mixed fleet runs for about 100 s")
	}
	redis := redisproc.Start(t)
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	var cpAddrs, grpcAddrs []string
	for i := 0; i < 2; i++ {
		addr, gaddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
		p := proctest.Start(t, proctest.Spec{Name: "control plane " + strconv.Itoa(i), Bin: filepath.Join(binDir, "sluice-controlplane"),
			Args: []string{"--listen", addr, "--grpc-listen", gaddr, "--log-level", "warn", "--resync-interval", "200ms", "--redis-url", redis.URL()}, Env: tokens})
		proctest.AwaitHTTP(t, "http://"+addr+"/readyz", 20*time.Second, p)
		proctest.AwaitListening(t, gaddr, 20*time.Second, p)
		cpAddrs, grpcAddrs = append(cpAddrs, addr), append(grpcAddrs, gaddr)
	}
	v := proctest.PutPolicy(t, cpAddrs[0], "default", adminToken, mixedPolicy)
	gate := newCutGate(t, cpAddrs[0])

	type member struct {
		do   func(ctx context.Context) (status int, degraded bool)
		name string
	}
	var members []member
	for i := 0; i < mixedWasm; i++ {
		cp := cpAddrs[i%2]
		if i == 0 {
			cp = gate.srv.Listener.Addr().String() // the Envoy the test cuts off
		}
		cfg := `{"tick":"50ms","control_plane":{"cluster":"control_plane","authority":"cp.test","policy":"default",` +
			`"token":"` + readToken + `","quota_token":"` + quotaToken + `","wait":"2s","timeout":"7s","quota_timeout":"300ms"}}`
		h, err := host.New(context.Background(), host.Config{Wasm: wasmBin, VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
			Workers: 1, Clock: host.SystemClock, Clusters: map[string]string{"control_plane": cp}, LogLevel: host.LogInfo})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		if !proctest.WaitFor(20*time.Second, func() bool {
			_, err := h.Worker(0).Do(context.Background(), host.Request{Path: "/probe"})
			return err == nil && proctest.WorkerVersions(h.Logs(), "default")[0] == v
		}) {
			t.Fatalf("Wasm Envoy %d never enforced version %d", i, v)
		}
		members = append(members, member{name: "wasm-" + strconv.Itoa(i), do: func(ctx context.Context) (int, bool) {
			r, err := h.Worker(0).Do(ctx, host.Request{Path: "/shared/x", Headers: host.Headers{{"x-user-id", hotUser}}})
			if err != nil {
				return 0, false
			}
			return r.Status, filterstate.Fields(r.FilterState)["quota"] == "degraded"
		}})
	}
	g := rlqstest.Generator{Sluicectl: filepath.Join(binDir, "sluicectl"), Server: cpAddrs[0], GRPC: grpcAddrs[0], Policy: "default",
		ReadToken: readToken, QuotaToken: quotaToken}
	settings := g.BucketSettings(t, "shared", time.Second)
	id := map[string]string{"policy": "default", "rule": "shared", "user": hotUser}
	var rlqs []*rlqsclient.Client
	for i := 0; i < mixedRLQS; i++ {
		c := rlqstest.Envoy(t, grpcAddrs[i%2], "default", quotaToken, settings)
		rlqs = append(rlqs, c)
		members = append(members, member{name: "rlqs-" + strconv.Itoa(i), do: func(context.Context) (int, bool) {
			if c.Decide(id) {
				return 200, false
			}
			return 429, false
		}})
	}

	// The load: twice the limit per window, spread evenly over the members.
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	var results []mixedResult
	var wg sync.WaitGroup
	every := mixedWindow * time.Duration(len(members)) / (2 * mixedLimit)
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(every * time.Duration(i) / time.Duration(len(members))):
			case <-ctx.Done():
				return
			}
			tk := time.NewTicker(every)
			defer tk.Stop()
			for {
				sent := time.Now().UnixNano()
				st, deg := m.do(ctx)
				recv := time.Now().UnixNano()
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				results = append(results, mixedResult{envoy: i, status: st, degraded: deg, sent: sent, recv: recv})
				mu.Unlock()
				select {
				case <-tk.C:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	// The schedule, in windows from the first whole one (w0 warms up, uncounted):
	// w1, w2 every part up; w3, w4 Wasm Envoy 0 cut off; w5 it is back; w6 Redis
	// frozen from its first to its last moment; w7 Redis back; w8 every part up.
	win := func(ns int64) int64 { return ns / int64(mixedWindow) }
	start := win(time.Now().UnixNano()) + 1
	at := func(w int64) {
		time.Sleep(time.Until(time.Unix(0, (start+w)*int64(mixedWindow)))) // window boundaries are wall-clock time
	}
	at(3)
	gate.cut.Store(true)
	at(5)
	gate.cut.Store(false)
	at(6)
	if err := redis.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	at(7)
	if err := redis.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	at(9)
	stop()
	wg.Wait()

	// The local share the cut-off Envoy may admit by itself: L/n for the n
	// Envoys sharing the key (every member), and the request every window passes.
	share := (mixedLimit+len(members)-1)/len(members) + 1
	type count struct {
		sure, straddling, denied, cutAdmitted, degraded int
		by                                              [mixedWasm + mixedRLQS]int
	}
	counts := make([]count, 9)
	for _, r := range results {
		ws, wr := win(r.sent)-start, win(r.recv)-start
		for w := ws; w <= wr; w++ {
			if w < 0 || w >= int64(len(counts)) {
				continue
			}
			c := &counts[w]
			switch {
			case r.status == 200 && ws == wr:
				c.sure++
				c.by[r.envoy]++
				if r.envoy == 0 {
					c.cutAdmitted++
				}
			case r.status == 200:
				c.straddling++
			case r.status == 429:
				c.denied++
			}
			if r.degraded {
				c.degraded++
			}
		}
	}
	var b strings.Builder
	b.WriteString("\nwindow  admitted (+straddling)  denied  Wasm 0 admitted  degraded  bound  verdict\n")
	for w := 1; w < len(counts); w++ {
		c := counts[w]
		bound, what := mixedLimit, "all up"
		switch w {
		case 3, 4:
			bound, what = mixedLimit+share, "Wasm 0 cut off"
		case 5:
			bound, what = mixedLimit+share, "Wasm 0 back"
		case 6:
			bound, what = mixedLimit, "Redis frozen"
		case 7:
			bound, what = 2*mixedLimit, "Redis back"
		}
		var bad []string
		if up := c.sure + c.straddling; up > bound {
			bad = append(bad, "admitted "+strconv.Itoa(up)+" > "+strconv.Itoa(bound))
		}
		if (w == 3 || w == 4) && c.cutAdmitted > share {
			bad = append(bad, "the cut-off Envoy admitted "+strconv.Itoa(c.cutAdmitted)+" > its share "+strconv.Itoa(share))
		}
		if (w == 3 || w == 4 || w == 6) && c.degraded == 0 {
			bad = append(bad, "no request degraded: the fault did not happen")
		}
		if (w == 1 || w == 2 || w == 8) && c.sure+c.straddling < mixedLimit*85/100 {
			bad = append(bad, "admitted "+strconv.Itoa(c.sure+c.straddling)+" < 85 % of the limit with demand at twice it")
		}
		verdict := "ok"
		if len(bad) > 0 {
			verdict = strings.Join(bad, "; ")
			t.Errorf("window %d (%s): %s", w, what, verdict)
		}
		b.WriteString("  " + strconv.Itoa(w) + " " + what + ": " + strconv.Itoa(c.sure) + " (+" + strconv.Itoa(c.straddling) + ")  " +
			strconv.Itoa(c.denied) + "  " + strconv.Itoa(c.cutAdmitted) + "  " + strconv.Itoa(c.degraded) + "  " + strconv.Itoa(bound) + "  " + verdict + "  by member " + fmtInts(c.by[:]) + "\n")
	}
	for i, c := range rlqs {
		s := c.Stats()
		b.WriteString("  rlqs-" + strconv.Itoa(i) + ": " + strconv.Itoa(int(s.Responses)) + " responses\n")
	}
	t.Log(b.String())
}

func fmtInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, " ")
}
