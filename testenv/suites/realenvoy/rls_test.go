package realenvoy

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// rlsConfig is an envoyproxy/ratelimit configuration file: the API 20 a second,
// each user (x-user-id) 5 a second.
const rlsConfig = `domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit:
      name: api
      unit: second
      requests_per_unit: 20
    descriptors:
      - key: x-user-id
        rate_limit:
          name: per-user
          unit: second
          requests_per_unit: 5
`

// rlsStack is Envoys running Envoy's ratelimit filter against control plane
// replicas on one Redis, configured as docs/rls.md says: the file imported with
// sluicectl import ratelimit, applied, and the bootstrap from sluicectl
// envoy-config rls.
type rlsStack struct {
	cps    []*controlPlane
	envoys []*envoyproc.Envoy
}

func startRLSStack(t *testing.T, replicas int) *rlsStack {
	t.Helper()
	return startRLSStackWith(t, rlsConfig, replicas)
}

// startRLSStackWith is startRLSStack with config as the envoyproxy/ratelimit
// file; Envoy i calls replica i mod replicas.
func startRLSStackWith(t *testing.T, config string, replicas int) *rlsStack {
	t.Helper()
	envoyproc.Binary(t, repo)
	rs := redisproc.Start(t)
	s := &rlsStack{}
	var grpcAddrs []string
	for i := 0; i < replicas; i++ {
		g := proctest.FreeAddr(t)
		grpcAddrs = append(grpcAddrs, g)
		s.cps = append(s.cps, startControlPlane(t, "control plane "+strconv.Itoa(i), "--redis-url", rs.URL(),
			"--grpc-listen", g, "--resync-interval", "200ms"))
	}
	dir := t.TempDir()
	cfgFile, polFile, bootFile := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "policy.json"), filepath.Join(dir, "envoy-rls.yaml")
	if err := os.WriteFile(cfgFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	sluicectlTo(t, polFile, "import", "ratelimit", cfgFile, "--policy", "edge")
	pol, err := os.ReadFile(polFile)
	if err != nil {
		t.Fatal(err)
	}
	proctest.PutPolicy(t, s.cps[0].addr, "edge", adminToken, string(pol))
	for _, cp := range s.cps[1:] { // each replica serves the policy before traffic starts
		if !proctest.WaitFor(readyTimeout, func() bool {
			req, _ := http.NewRequest("GET", "http://"+cp.addr+"/v1/policies/edge", nil)
			req.Header.Set("Authorization", "Bearer "+readToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		}) {
			t.Fatal("a replica does not serve the policy")
		}
	}
	up := startUpstream(t)
	sluicectlTo(t, bootFile, "envoy-config", "rls", "-f", polFile, "--upstream", up, "--grpc", grpcAddrs[0])
	for i := 0; i < 2; i++ {
		s.envoys = append(s.envoys, envoyproc.Start(t, envoyproc.Options{Name: "rls-" + strconv.Itoa(i), Root: repo, Config: bootFile,
			Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
				AccessLog: filepath.Join(t.TempDir(), "access.log"),
				Clusters:  map[string]string{"upstream": up, "sluice_rls": grpcAddrs[i%len(grpcAddrs)]}}}))
	}
	return s
}

// sluicectlTo runs the built sluicectl with args, the quota token in its
// environment as docs/rls.md says, and writes its standard output to out.
func sluicectlTo(t *testing.T, out string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), args...)
	cmd.Env = append(os.Environ(), "SLUICE_QUOTA_TOKEN="+quotaToken)
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl %s: %v", strings.Join(args, " "), err)
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// offer sends perSecond requests a second (user "" sends no x-user-id) over
// the Envoys in turn, spread over each second but never within 30 ms of its
// edges (so that Envoy's and the control plane's clocks agree on the window),
// from start for n seconds, and returns the responses' rate-limit headers by
// status.
func (s *rlsStack) offer(t *testing.T, user string, perSecond int, start time.Time, n int) map[int][]http.Header {
	t.Helper()
	var mu sync.Mutex
	got := map[int][]http.Header{}
	var wg sync.WaitGroup
	step := (time.Second - 60*time.Millisecond) / time.Duration(perSecond)
	for sec := 0; sec < n; sec++ {
		for k := 0; k < perSecond; k++ {
			at := start.Add(time.Duration(sec)*time.Second + 30*time.Millisecond + time.Duration(k)*step)
			time.Sleep(time.Until(at))
			e := s.envoys[(sec*perSecond+k)%len(s.envoys)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", "http://"+e.Listener+"/items", nil)
				if user != "" {
					req.Header.Set("X-User-Id", user)
				}
				resp, err := fresh.Do(req)
				if err != nil {
					t.Errorf("%s: %v", e.Name, err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				got[resp.StatusCode] = append(got[resp.StatusCode], resp.Header)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return got
}

// admittedPerSecond counts, from every Envoy's access log, the requests of
// path admitted (200) and denied (429) in each second from start, n seconds.
func (s *rlsStack) admittedPerSecond(t *testing.T, start time.Time, n int) (admitted, denied []int) {
	t.Helper()
	admitted, denied = make([]int, n), make([]int, n)
	for _, e := range s.envoys {
		for _, line := range envoyproc.ReadJSONLines(t, e.AccessLog) {
			ts, err := time.Parse(time.RFC3339Nano, line["timestamp"].(string))
			if err != nil {
				t.Fatalf("%s: timestamp %v: %v", e.Name, line["timestamp"], err)
			}
			i := int(ts.Sub(start) / time.Second)
			if ts.Before(start) || i >= n {
				continue
			}
			switch status(line["status"]) {
			case 200:
				admitted[i]++
			case 429:
				denied[i]++
			default:
				t.Errorf("%s: status %v", e.Name, line["status"])
			}
		}
	}
	return admitted, denied
}

// awaitLogged waits until the access logs hold total decisions in the n
// seconds from start (file access logs are flushed every 100 ms), and returns
// admittedPerSecond's counts.
func (s *rlsStack) awaitLogged(t *testing.T, start time.Time, n, total int) (admitted, denied []int) {
	t.Helper()
	proctest.WaitFor(10*time.Second, func() bool {
		admitted, denied = s.admittedPerSecond(t, start, n)
		sum := 0
		for i := range admitted {
			sum += admitted[i] + denied[i]
		}
		return sum == total
	})
	return admitted, denied
}

// status reads an access-log status, a JSON number or string.
func status(v any) int {
	switch v := v.(type) {
	case float64:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// TestEnvoysRatelimitFilterEnforcesAnImportedConfigurationExactly: an
// envoyproxy/ratelimit file, imported and applied as docs/rls.md says, enforced
// by two real Envoys' ratelimit filters against two control plane replicas on
// one Redis: counted from the Envoys' access logs, exactly L admitted in every
// second when twice L is offered (the API's 20, and one user's 5), the draft-03
// headers on the responses as Envoy 1.40 writes them (X-RateLimit-Limit: the
// binding limit, then each descriptor's "limit;w=seconds;name=…" with its rate_limit name); with the replicas killed every request passes
// (failure_mode_deny false) and Envoy counts the errors.
func TestEnvoysRatelimitFilterEnforcesAnImportedConfigurationExactly(t *testing.T) {
	s := startRLSStack(t, 2)
	const seconds = 4

	// The API rule alone (no user header): 40 a second offered, 20 admitted.
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	s.offer(t, "", 40, start, seconds)
	admitted, denied := s.awaitLogged(t, start, seconds, 40*seconds)
	for i := range admitted {
		t.Logf("api second %d: %d admitted, %d denied", i, admitted[i], denied[i])
		if admitted[i] != 20 || denied[i] != 20 {
			t.Errorf("api second %d: %d admitted and %d denied, want exactly 20 and 20", i, admitted[i], denied[i])
		}
	}

	// One user: 10 a second offered, 5 admitted (the API's 20 not reached).
	start = time.Now().Truncate(time.Second).Add(2 * time.Second)
	got := s.offer(t, "alice", 10, start, seconds)
	admitted, denied = s.awaitLogged(t, start, seconds, 10*seconds)
	for i := range admitted {
		t.Logf("user second %d: %d admitted, %d denied", i, admitted[i], denied[i])
		if admitted[i] != 5 || denied[i] != 5 {
			t.Errorf("user second %d: %d admitted and %d denied, want exactly 5 and 5", i, admitted[i], denied[i])
		}
	}
	t.Logf("headers: 200 %v; 429 %v", got[200][0], got[429][0])
	for code, hs := range got {
		for _, h := range hs {
			lim, rem, reset := h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")
			// Envoy 1.40 writes the least remaining descriptor's limit, then every
			// descriptor's quota policy with its window and name (the rule id).
			if !strings.HasPrefix(lim, "5, ") || !strings.Contains(lim, `5;w=1;name="per-user"`) ||
				!strings.Contains(lim, `20;w=1;name="api"`) || rem == "" || reset != "1" {
				t.Errorf("%d: X-RateLimit-Limit %q Remaining %q Reset %q, want the user's 5 a second", code, lim, rem, reset)
			}
			if code == 429 && rem != "0" {
				t.Errorf("429 with X-RateLimit-Remaining %q", rem)
			}
		}
	}

	// The replicas gone: every request passes, and Envoy counts the errors.
	for _, cp := range s.cps {
		cp.Kill()
	}
	for i := 0; i < 20; i++ {
		e := s.envoys[i%2]
		resp, err := fresh.Get("http://" + e.Listener + "/items")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s without a control plane: %d, want 200 (failure_mode_deny false)", e.Name, resp.StatusCode)
		}
	}
	var failOpen float64
	for _, e := range s.envoys {
		failOpen += envoyStat(t, e.Admin, "cluster.upstream.ratelimit.failure_mode_allowed")
	}
	if failOpen < 20 {
		t.Errorf("ratelimit.failure_mode_allowed %v, want the 20 requests", failOpen)
	}
}

// envoyStat reads one counter of Envoy's admin /stats (0 when absent).
func envoyStat(t *testing.T, admin, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/stats?filter=^" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// sharedPolicy is mixedPolicy's per-tenant rule made an HTTP descriptor rule:
// Envoy's ratelimit filter sends (generic_key=q, tenant=<tenant>), which fills
// the rule's tenant key part, so all three kinds of Envoy count on one key.
var sharedPolicy = `{"policy":"default","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"probe","match":{"path_prefix":"/reports/"},"key":["tenant"],"algorithm":"fixed_window","limit":1,"window":"1h"},` +
	`{"id":"per-tenant","match":{"path_prefix":"/q/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsLimit) + `,"window":"` + rlqsWindow.String() + `","scope":"fleet",` +
	`"descriptor":{"domain":"edge","http":true,"entries":[{"key":"generic_key","value":"q"},{"key":"tenant","key_part":"tenant"}]}}]}`

// TestRatelimitRateLimitQuotaAndWasmEnvoysShareOneLimit: a real Envoy of each
// kind — Envoy's ratelimit filter (the control plane's RateLimitService, counting
// on the Wasm filters' env with --rls-env), Envoy's rate_limit_quota filter
// (RLQS) and the sluice Wasm filter — spend one fleet key through two control
// planes on one Redis: offered 5×L a window, a third by each kind, never more
// than L and at least 95 % of L is admitted in a window, and the
// ratelimit-filter and Wasm Envoys, which
// ask when their requests come, are admitted in every window (the RLQS Envoy, on
// its 5 s reports, over the run).
func TestRatelimitRateLimitQuotaAndWasmEnvoysShareOneLimit(t *testing.T) {
	envoyproc.Binary(t, repo)
	rs := redisproc.Start(t)
	grpcAddr := proctest.FreeAddr(t)
	cps := []*controlPlane{
		startControlPlane(t, "control plane 0", "--redis-url", rs.URL(), "--resync-interval", "200ms"),
		startControlPlane(t, "control plane 1", "--redis-url", rs.URL(), "--resync-interval", "200ms",
			"--grpc-listen", grpcAddr, "--rls-env", "dev"),
	}
	v := proctest.PutPolicy(t, cps[0].addr, "default", adminToken, sharedPolicy)
	up := startUpstream(t)

	wasm := startProxy(t, envoyKind, proxySpec{name: "wasm", config: "envoy/envoy.yaml", upstream: up,
		clusters: map[string]string{"control_plane": cps[0].addr}})
	awaitVersion(t, wasm, v)
	rlqsEnvoy := envoyproc.Start(t, envoyproc.Options{Name: "rlqs", Root: repo, Config: rlqsBootstrap(t, sharedPolicy, "dev", grpcAddr, up),
		Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
			Clusters: map[string]string{"upstream": up, "sluice_rlqs": grpcAddr}}})
	dir := t.TempDir()
	polFile, bootFile := filepath.Join(dir, "policy.json"), filepath.Join(dir, "envoy-rls.yaml")
	if err := os.WriteFile(polFile, []byte(sharedPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	sluicectlTo(t, bootFile, "envoy-config", "rls", "-f", polFile, "--grpc", grpcAddr, "--upstream", up)
	rlsEnvoy := envoyproc.Start(t, envoyproc.Options{Name: "rls", Root: repo, Config: bootFile,
		Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
			Clusters: map[string]string{"upstream": up, "sluice_rls": grpcAddr}}})
	kinds := []struct{ name, addr string }{{"ratelimit", rlsEnvoy.Listener}, {"rlqs", rlqsEnvoy.Listener}, {"wasm", wasm.addr}}

	const windows = 3
	per := rlqsWindow / (5 * rlqsLimit)
	start := time.Now().Truncate(rlqsWindow).Add(rlqsWindow)
	admitted := map[int64][]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < windows*5*rlqsLimit; i++ {
		at := start.Add(time.Duration(i) * per)
		if off := at.Sub(at.Truncate(rlqsWindow)); off < 30*time.Millisecond || rlqsWindow-off < 30*time.Millisecond {
			continue
		}
		time.Sleep(time.Until(at))
		k := i % len(kinds)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://"+kinds[k].addr+"/q/items", nil)
			req.Header.Set("X-Tenant-Id", "acme")
			resp, err := fresh.Do(req)
			if err != nil {
				t.Errorf("%s: %v", kinds[k].name, err)
				return
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				mu.Lock()
				w := at.Truncate(rlqsWindow).Unix()
				if admitted[w] == nil {
					admitted[w] = make([]int, len(kinds))
				}
				admitted[w][k]++
				mu.Unlock()
			case http.StatusTooManyRequests:
			default:
				t.Errorf("%s: status %d", kinds[k].name, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	total := make([]int, len(kinds))
	for w := start; w.Before(start.Add(windows * rlqsWindow)); w = w.Add(rlqsWindow) {
		a := admitted[w.Unix()]
		if a == nil {
			a = make([]int, len(kinds))
		}
		sum := 0
		for k := range kinds {
			sum += a[k]
			total[k] += a[k]
		}
		t.Logf("window %s: %d admitted through the ratelimit filter, %d through RLQS, %d through Wasm (L = %d, %d offered)",
			w.Format("15:04:05"), a[0], a[1], a[2], rlqsLimit, 5*rlqsLimit)
		if sum > rlqsLimit {
			t.Errorf("window %s: %d admitted, over L = %d", w.Format("15:04:05"), sum, rlqsLimit)
		}
		// Demand remains in every window (5×L offered): the budget is spent.
		if sum < rlqsLimit*95/100 {
			t.Errorf("window %s: %d admitted, less than 95 %% of L = %d while demand remained", w.Format("15:04:05"), sum, rlqsLimit)
		}
		if a[0] == 0 || a[2] == 0 {
			t.Errorf("window %s: the ratelimit-filter Envoy (%d) or the Wasm Envoy (%d) got nothing", w.Format("15:04:05"), a[0], a[2])
		}
	}
	if total[1] == 0 {
		t.Errorf("the RLQS Envoy got nothing in %d windows", windows)
	}
}

// TestADestinationClusterRuleCountsOnlyRequestsToThatCluster: rules on
// destination_cluster, the bootstrap from sluicectl envoy-config rls, the real
// Envoy's ratelimit filter: a request to the route's cluster ("upstream")
// counts against the rule of that cluster (3 a minute: 3 of 5 admitted) and
// never against the rule of another cluster ("payments", 1 a minute), whose
// entry the command leaves to that cluster's route with a note. An unnamed
// limit's X-RateLimit-Limit carries no name, as the policy lab writes it.
func TestADestinationClusterRuleCountsOnlyRequestsToThatCluster(t *testing.T) {
	envoyproc.Binary(t, repo)
	rs := redisproc.Start(t)
	grpcAddr := proctest.FreeAddr(t)
	cp := startControlPlane(t, "control plane", "--redis-url", rs.URL(), "--grpc-listen", grpcAddr)
	pol := `{"policy":"clusters","rules":[
 {"id":"payments","descriptor":{"domain":"edge","entries":[{"key":"destination_cluster","value":"payments"}]},"algorithm":"fixed_window","limit":1,"window":"1m","scope":"fleet"},
 {"id":"upstream","descriptor":{"domain":"edge","entries":[{"key":"destination_cluster","value":"upstream"}]},"algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet"}]}`
	dir := t.TempDir()
	polFile, bootFile := filepath.Join(dir, "policy.json"), filepath.Join(dir, "envoy-rls.yaml")
	if err := os.WriteFile(polFile, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	proctest.PutPolicy(t, cp.addr, "clusters", adminToken, pol)
	up := startUpstream(t)
	sluicectlTo(t, bootFile, "envoy-config", "rls", "-f", polFile, "--upstream", up, "--grpc", grpcAddr)
	boot, err := os.ReadFile(bootFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(boot), `# NOTE: rule payments: destination_cluster "payments"`) {
		t.Errorf("no note on the payments rule's route:\n%s", boot)
	}
	e := envoyproc.Start(t, envoyproc.Options{Name: "rls", Root: repo, Config: bootFile,
		Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t),
			AccessLog: filepath.Join(t.TempDir(), "access.log"),
			Clusters:  map[string]string{"upstream": up, "sluice_rls": grpcAddr}}})
	proctest.AwaitOneWindow(t, time.Minute, 20*time.Second)
	codes := map[int]int{}
	for range 5 {
		resp, err := fresh.Get("http://" + e.Listener + "/items")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
		// Envoy names a limit in the quota policy only when it has a name
		// (ratelimit_headers.cc); these rules have none.
		if got := resp.Header.Get("X-RateLimit-Limit"); got != "3, 3;w=60" {
			t.Errorf("X-RateLimit-Limit %q, want \"3, 3;w=60\"", got)
		}
	}
	if codes[200] != 3 || codes[429] != 2 {
		t.Errorf("5 requests to cluster upstream: %v, want 3 admitted (its rule) and 2 refused, none counted against payments", codes)
	}
}

// TestEnvoysRatelimitFilterNeverRefusesWhileTheWindowHasBudget: two real
// Envoys' ratelimit filters, each on its own control plane replica, a key of 2,000 a
// minute, 64 concurrent clients offering 2,600 requests within one minute:
// counted from the Envoys' access logs, exactly 2,000 admitted (never more),
// and no request refused before an admitted one started (its 429 written
// while the window still had budget).
func TestEnvoysRatelimitFilterNeverRefusesWhileTheWindowHasBudget(t *testing.T) {
	s := startRLSStackWith(t, apiPerMinute, 2)
	proctest.AwaitOneWindow(t, time.Minute, 40*time.Second)
	window := time.Now().Truncate(time.Minute)
	sent := new(atomic.Int64)
	countWindow(t, s, window, offer{s.envoys[0], 32, sent, 2600}, offer{s.envoys[1], 32, sent, 2600})
}

// TestAnEnvoyWhoseTrafficStoppedLeavesItsUnitsToTheOther: as above, but the
// first Envoy's 48 clients offer 1,920 requests and the second's 16 clients
// 640, then stop: the units the second Envoy's replica holds when its
// traffic stops reach the first Envoy's requests (recalled), so exactly 2,000
// are admitted and none refused before an admitted one started.
func TestAnEnvoyWhoseTrafficStoppedLeavesItsUnitsToTheOther(t *testing.T) {
	s := startRLSStackWith(t, apiPerMinute, 2)
	proctest.AwaitOneWindow(t, time.Minute, 40*time.Second)
	window := time.Now().Truncate(time.Minute)
	countWindow(t, s, window, offer{s.envoys[0], 48, new(atomic.Int64), 1920}, offer{s.envoys[1], 16, new(atomic.Int64), 640})
}

// apiPerMinute is one key of 2,000 a minute in envoyproxy/ratelimit's
// configuration language.
const apiPerMinute = `domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit:
      name: api
      unit: minute
      requests_per_unit: 2000
`

// offer is n clients sending requests to Envoy e until sent counts requests
// (shared with other offers or not).
type offer struct {
	e        *envoyproc.Envoy
	n        int
	sent     *atomic.Int64
	requests int64
}

// countWindow runs every offer, then reads the Envoys' access logs until
// every request sent is logged in the minute from window, and asserts that
// exactly 2,000 were admitted and no 429 was written before an admitted
// request started.
func countWindow(t *testing.T, s *rlsStack, window time.Time, offers ...offer) {
	t.Helper()
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, o := range offers {
		for range o.n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for o.sent.Add(1) <= o.requests {
					resp, err := fresh.Get("http://" + o.e.Listener + "/items")
					if err != nil {
						t.Errorf("%s: %v", o.e.Name, err)
						return
					}
					resp.Body.Close()
					total.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	type logged struct {
		start, end time.Time
		status     int
	}
	var lines []logged
	want := int(total.Load())
	proctest.WaitFor(10*time.Second, func() bool {
		lines = lines[:0]
		for _, e := range s.envoys {
			for _, line := range envoyproc.ReadJSONLines(t, e.AccessLog) {
				ts, err := time.Parse(time.RFC3339Nano, line["timestamp"].(string))
				if err != nil {
					t.Fatalf("%s: timestamp %v: %v", e.Name, line["timestamp"], err)
				}
				if ts.Before(window) || !ts.Before(window.Add(time.Minute)) {
					continue
				}
				d := time.Duration(status(line["duration"])) * time.Millisecond
				lines = append(lines, logged{start: ts, end: ts.Add(d), status: status(line["status"])})
			}
		}
		return len(lines) == want
	})
	admitted, refused, early := 0, 0, 0
	var lastAdmittedStart time.Time
	for _, l := range lines {
		switch l.status {
		case 200:
			admitted++
			if l.start.After(lastAdmittedStart) {
				lastAdmittedStart = l.start
			}
		case 429:
			refused++
		default:
			t.Errorf("status %d", l.status)
		}
	}
	for _, l := range lines {
		// A millisecond of slack: the log's times are whole milliseconds.
		if l.status == 429 && l.end.Add(time.Millisecond).Before(lastAdmittedStart) {
			early++
		}
	}
	t.Logf("%d logged in the window: %d admitted, %d refused, %d refused before an admitted request started", len(lines), admitted, refused, early)
	if len(lines) != want || admitted != 2000 || early != 0 {
		t.Errorf("want %d logged, exactly 2,000 admitted and none refused before an admitted request started", want)
	}
}

// TestAKilledReplicaStrandsNoneOfASmallKeysBudget: two Envoys' ratelimit
// filters, each on its own control plane replica (one Redis), a key of 10 a
// minute and one of 100 a day. Envoy 0 admits 4 and 10 of them; its replica
// is killed (SIGKILL: nothing reported or returned); Envoy 1, on the other
// replica, is then offered 16 and 110. Counted from the access logs: exactly
// 10 in the minute and 100 in the day, and no 429 before the last 200.
func TestAKilledReplicaStrandsNoneOfASmallKeysBudget(t *testing.T) {
	s := startRLSStackWith(t, `domain: edge
descriptors:
  - key: x-minute-user
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: x-day-user
    rate_limit:
      unit: day
      requests_per_unit: 100
`, 2)
	proctest.AwaitOneWindow(t, time.Minute, 30*time.Second)
	proctest.AwaitOneWindow(t, 24*time.Hour, time.Minute)
	send := func(e *envoyproc.Envoy, header string, n int) {
		for range n {
			req, _ := http.NewRequest("GET", "http://"+e.Listener+"/"+header, nil)
			req.Header.Set(header, "killed-replica")
			resp, err := fresh.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", e.Name, err)
			}
			resp.Body.Close()
		}
	}
	send(s.envoys[0], "x-minute-user", 4)
	send(s.envoys[0], "x-day-user", 10)
	s.cps[0].Kill()
	send(s.envoys[1], "x-minute-user", 16)
	send(s.envoys[1], "x-day-user", 110)
	// Each Envoy's log in the order its (sequential) requests were answered,
	// Envoy 0's first.
	var lines []map[string]any
	proctest.WaitFor(10*time.Second, func() bool {
		lines = append(envoyproc.ReadJSONLines(t, s.envoys[0].AccessLog), envoyproc.ReadJSONLines(t, s.envoys[1].AccessLog)...)
		return len(lines) == 140
	})
	if len(lines) != 140 {
		t.Fatalf("%d access-log lines, want 140", len(lines))
	}
	for _, c := range []struct {
		path  string
		limit int
	}{{"/x-minute-user", 10}, {"/x-day-user", 100}} {
		admitted, firstRefused, early := 0, -1, 0
		for _, l := range lines {
			if l["path"] != c.path {
				continue
			}
			switch status(l["status"]) {
			case 200:
				admitted++
				if firstRefused >= 0 {
					early++
				}
			case 429:
				if firstRefused < 0 {
					firstRefused = admitted
				}
			default:
				t.Errorf("%s: status %v (flags %v)", c.path, l["status"], l["flags"])
			}
		}
		t.Logf("%s: %d admitted of a limit of %d; %d admitted after a 429", c.path, admitted, c.limit, early)
		if admitted != c.limit || early != 0 {
			t.Errorf("%s: %d admitted, want %d, and %d admitted after a 429, want 0", c.path, admitted, c.limit, early)
		}
	}
}
