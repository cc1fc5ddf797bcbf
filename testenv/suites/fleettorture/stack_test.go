package fleettorture

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// Built once per test binary by TestMain, into a temporary directory.
var (
	binDir  string
	wasmBin []byte
	repo    string
)

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/sluicectl", "./testenv/cmd/sluice-devproxy", "./testenv/cmd/sluice-echo"},
		func(dir, root string) (err error) {
			binDir, repo = dir, root
			wasmBin, err = os.ReadFile(filepath.Join(dir, "sluice.wasm"))
			return err
		})
}

const (
	adminToken = "torture-admin"
	readToken  = "torture-read"
	quotaToken = "torture-quota"

	// limit is rule tight's L per window; looseLimit is rule loose's, never spent.
	limit      = 300
	looseLimit = 100000000
	window     = 2 * time.Second
)

// hotUser is the user every request names: 2 KB long, so that the whole torture
// runs on a key part carried as its digest (as a client's long header is).
var hotUser = "hot-" + strings.Repeat("u", 2044)

// policyDoc has the two rules the test counts (see the package doc): both keyed
// by user, both fleet-scoped over a 2 s fixed window, both denying when the
// quota service cannot answer, so that a fault can only under-admit.
var policyDoc = `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"tight","match":{"path_prefix":"/tight"},"key":["user"],"algorithm":"fixed_window","limit":` + strconv.Itoa(limit) +
	`,"window":"2s","scope":"fleet","on_quota_failure":"deny"},` +
	`{"id":"loose","match":{"path_prefix":"/loose"},"key":["user"],"algorithm":"fixed_window","limit":` + strconv.Itoa(looseLimit) +
	`,"window":"2s","scope":"fleet","on_quota_failure":"deny"}]}`

// envoy is one member of the fleet: a dev proxy process or an in-process host.
type envoy struct {
	name string
	// do sends one request for the hot user on path and returns the status, and
	// whether the filter state says a fleet rule degraded (known for hosts only).
	do   func(ctx context.Context, path, user string) (status int, degraded bool, err error)
	dead atomic.Bool
	kill func() // dev proxies: kill -9
}

// stack is the fleet under test.
type stack struct {
	t       *testing.T
	redis   *redisproc.Server // nil on a Cluster
	cps     []*proctest.Proc
	cpAddrs []string
	envoys  []*envoy
	version uint64
}

// startStack starts Redis (a Cluster when cluster), two control-plane replicas,
// an upstream, three dev proxies (two workers each) and n in-process Envoys (one
// worker each), each Envoy's control_plane cluster on one replica in turn, and
// publishes policyDoc, waiting until every Envoy enforces it.
func startStack(t *testing.T, n int, cluster bool) *stack {
	s := &stack{t: t}
	var redisURL string
	if cluster {
		cl := redisproc.StartCluster(t)
		redisURL = strings.Join(cl.Addrs(), ",")
	} else {
		s.redis = redisproc.Start(t)
		redisURL = s.redis.URL()
	}
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	for i := 0; i < 2; i++ {
		addr := proctest.FreeAddr(t)
		p := proctest.Start(t, proctest.Spec{Name: "control plane " + strconv.Itoa(i), Bin: filepath.Join(binDir, "sluice-controlplane"),
			Args: []string{"--listen", addr, "--log-level", "warn", "--resync-interval", "200ms", "--redis-url", redisURL}, Env: tokens})
		proctest.AwaitHTTP(t, "http://"+addr+"/readyz", 20*time.Second, p)
		s.cps, s.cpAddrs = append(s.cps, p), append(s.cpAddrs, addr)
	}
	s.version = proctest.PutPolicy(t, s.cpAddrs[0], "default", adminToken, policyDoc)

	up := proctest.FreeAddr(t)
	echo := proctest.Start(t, proctest.Spec{Name: "upstream", Bin: filepath.Join(binDir, "sluice-echo"), Args: []string{"--listen", up}})
	proctest.AwaitHTTP(t, "http://"+up+"/", 20*time.Second, echo)
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for i := 0; i < 3; i++ {
		addr := proctest.FreeAddr(t)
		dp := proctest.Start(t, proctest.Spec{Name: "dev proxy " + strconv.Itoa(i), Bin: filepath.Join(binDir, "sluice-devproxy"), Dir: repo,
			Args: []string{"--config", "envoy/envoy.yaml", "--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", addr,
				"--upstream", up, "--cluster", "control_plane=" + s.cpAddrs[i%2], "--access-log", filepath.Join(t.TempDir(), "access.log"),
				"--workers", "2", "--log-level", "warn"}, Env: tokens})
		proctest.AwaitListening(t, addr, 60*time.Second, dp)
		e := &envoy{name: "proxy-" + strconv.Itoa(i), kill: dp.Kill}
		e.do = func(ctx context.Context, path, user string) (int, bool, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
			req.Header.Set("X-User-Id", user)
			resp, err := hc.Do(req)
			if err != nil {
				return 0, false, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, false, nil
		}
		s.envoys = append(s.envoys, e)
	}
	for i := 0; i < n; i++ {
		cfg := `{"env":"dev","headers":"x-ratelimit","tick":"50ms","control_plane":{"cluster":"control_plane","authority":"cp.test",` +
			`"policy":"default","token":"` + readToken + `","quota_token":"` + quotaToken + `","wait":"2s","timeout":"7s"}}`
		h, err := host.New(context.Background(), host.Config{Wasm: wasmBin, VMID: "sluice", PluginName: "sluice",
			PluginConfig: []byte(cfg), Workers: 1, Clock: host.SystemClock,
			Clusters: map[string]string{"control_plane": s.cpAddrs[i%2]}, LogLevel: host.LogWarn})
		if err != nil {
			t.Fatalf("host.New: %v", err)
		}
		t.Cleanup(func() { h.Close() })
		e := &envoy{name: "host-" + strconv.Itoa(i)}
		e.do = func(ctx context.Context, path, user string) (int, bool, error) {
			r, err := h.Worker(0).Do(ctx, host.Request{Path: path, Headers: host.Headers{{"x-user-id", user}}})
			if err != nil {
				return 0, false, err
			}
			return r.Status, filterstate.Fields(r.FilterState)["quota"] == "degraded", nil
		}
		s.envoys = append(s.envoys, e)
	}
	// Every Envoy enforces the policy once a probe user's loose requests carry
	// its limit; a dev proxy's two workers are both probed by several requests.
	for _, e := range s.envoys {
		ok := proctest.WaitFor(60*time.Second, func() bool {
			for k := 0; k < 4; k++ {
				if st, _, err := e.do(context.Background(), "/loose/probe", "probe-"+e.name); err != nil || st != 200 {
					return false
				}
			}
			st, _, err := e.do(context.Background(), "/tight/probe", "probe-"+e.name)
			return err == nil && st == 200
		})
		if !ok {
			t.Fatalf("%s never enforced the policy", e.name)
		}
	}
	return s
}

// result is one request of the load.
type result struct {
	envoy      int
	tight      bool
	status     int // 0: no answer (the Envoy is gone)
	degraded   bool
	sent, recv int64 // Unix ns
}

// load sends paced requests for the hot user through every live Envoy: rate
// tight and rate loose requests per second in all, spread evenly.
type load struct {
	mu      sync.Mutex
	results []result
	// lastLoose is, per Envoy, when it last answered a loose request 200.
	lastLoose []atomic.Int64
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

func (s *stack) startLoad(rate int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel, lastLoose: make([]atomic.Int64, len(s.envoys))}
	every := time.Duration(int64(time.Second) * int64(len(s.envoys)) / int64(2*rate))
	for i, e := range s.envoys {
		l.wg.Add(1)
		go func(i int, e *envoy) {
			defer l.wg.Done()
			// Stagger the Envoys over one period so the load is smooth.
			first := time.NewTimer(every * time.Duration(i) / time.Duration(len(s.envoys)))
			select {
			case <-first.C:
			case <-ctx.Done():
				return
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for n := 0; ; n++ {
				if e.dead.Load() {
					return
				}
				tight := n%2 == 0
				path := "/loose/x"
				if tight {
					path = "/tight/x"
				}
				sent := time.Now().UnixNano()
				st, deg, err := e.do(ctx, path, hotUser)
				recv := time.Now().UnixNano()
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					st = 0
				}
				if !tight && st == 200 {
					l.lastLoose[i].Store(recv)
				}
				l.mu.Lock()
				l.results = append(l.results, result{envoy: i, tight: tight, status: st, degraded: deg, sent: sent, recv: recv})
				l.mu.Unlock()
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		}(i, e)
	}
	return l
}

func (l *load) stop() []result {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.results
}

// awaitRecovered waits until every live Envoy answered a loose request 200
// after since, and returns when that happened.
func (s *stack) awaitRecovered(l *load, since int64, limit time.Duration) int64 {
	s.t.Helper()
	var at int64
	ok := proctest.WaitFor(limit, func() bool {
		at = since
		for i, e := range s.envoys {
			if e.dead.Load() {
				continue
			}
			v := l.lastLoose[i].Load()
			if v <= since {
				return false
			}
			at = max(at, v)
		}
		return true
	})
	if !ok {
		s.t.Fatalf("the fleet did not recover within %v of the fault", limit)
	}
	return at
}

// windowOf is the index of the fixed window (aligned to the Unix epoch, as the
// limiter aligns it) that holds ns.
func windowOf(ns int64) int64 { return ns / int64(window) }

// awaitWindowStart waits for the start of the next window.
func awaitWindowStart() int64 {
	w := windowOf(time.Now().UnixNano()) + 1
	time.Sleep(time.Until(time.Unix(0, w*int64(window)))) // a clock boundary, not an event: windows are wall-clock time
	return w
}

// hotKey is the counter key of the hot user under rule id, as the filter builds it.
func hotKey(t testing.TB, id string) string {
	t.Helper()
	p, err := rules.ParsePolicy([]byte(policyDoc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{Env: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < c.Len(); i++ {
		if c.Rule(i).ID == id {
			k, ok := c.AppendKey(nil, i, &rules.Request{Headers: []rules.Header{{Name: "x-user-id", Value: hotUser}}})
			if !ok || len(k) > 200 {
				t.Fatalf("the hot user's key under %s: %q %v", id, k, ok)
			}
			return string(k)
		}
	}
	t.Fatalf("no rule %s", id)
	return ""
}

// press starts n quota clients that ask the replicas, in turn, for 5 units of
// the loose rule's key of the hot user in a tight loop, reporting what they were
// granted as used (as Envoys would); the returned function stops them and fails
// the test if none was ever granted (the key would be wrong) or one got a
// non-200 answer.
func (s *stack) press(n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	var granted, bad atomic.Int64
	var wg sync.WaitGroup
	key := hotKey(s.t, "loose")
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var used uint64
			for k := 0; ctx.Err() == nil; k++ {
				body := quota.AppendRequest(nil, &quota.Request{Envoy: "pressure-" + strconv.Itoa(i), Policy: "default", Version: s.version,
					Env: "dev", Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "loose", Key: key, Used: used, Want: 5}}})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.cpAddrs[(i+k)%2]+"/v1/quota", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+quotaToken)
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					continue // stopped, or a replica down
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					bad.Add(1)
					continue
				}
				used = 0
				if r, err := quota.DecodeResponse(b); err == nil && len(r.Keys) == 1 {
					used = r.Keys[0].Granted
					if used > 0 {
						granted.Add(1)
					}
				} else {
					bad.Add(1)
				}
			}
		}(i)
	}
	return func() {
		cancel()
		wg.Wait()
		if granted.Load() == 0 {
			s.t.Errorf("the %d pressing quota clients were never granted a unit (is the key %q right?)", n, key)
		}
		if bad.Load() > 0 {
			s.t.Errorf("the pressing quota clients got %d answers other than 200", bad.Load())
		}
		s.t.Logf("%d quota clients pressing on the loose key: %d answers granted units", n, granted.Load())
	}
}
