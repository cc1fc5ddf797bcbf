package realenvoy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// The filter-chain benchmark: K copies of one filter in the real Envoy's
// chain (2 workers, a direct_response route, no access log), driven by wrk
// over loopback, variants interleaved round by round. A filter's added wall
// time per request is (1/rps − 1/rps(no filter)) / K: K copies multiply the
// filter's cost against the same Envoy, so the noise of a shared 2-core
// machine weighs K times less. A denied request stops at the first filter
// (its local reply skips the rest of the chain), so denied variants run one
// copy (K = 1) and read against each other only.
//
// Yardsticks, in the same run: Envoy's own local_ratelimit (native code),
// gopeer (filter/testdata/gopeer, the least a Go limiter with an exact
// shared counter does, on sluice's binding), the call floor
// (filter/testdata/callfloor: sluice's host calls with their sizes, no
// logic between them, so sluice's distance to it is its own Go code) and,
// when SLUICE_CPEER_WASM
// names one, a freestanding C limiter of the same shape (the module is not
// part of this repository).

// chainK is how many copies of an allowing filter the chain holds.
const chainK = 8

// chainUsers is how many users the load spreads over (x-user-id).
const chainUsers = 1000

// chainVariant is one chain: the filter config repeated k times.
type chainVariant struct {
	name   string
	k      int
	status int    // what every measured request gets
	module string // "sluice", "baseline", "gopeer", "callfloor", "cpeer", or "" (no Wasm filter)
	config string // the plugin configuration
	native bool   // Envoy's local_ratelimit instead of a Wasm filter
	// fleet: the policy comes from the control plane (chainFleetPolicy),
	// whose quota service leases the fleet rule's budget.
	fleet bool
}

// chainFleetPolicy is the fleet variant's policy, published to the control
// plane: one fleet token bucket per user that no run spends, so after the
// warm-up every request spends from its key's warm lease; and a probe of
// one request an hour per user on /probe/ (8 units: each of the chain's
// copies counts the request on the one shared key), which the benchmark
// never sends, by which the test sees the published policy in force.
var chainFleetPolicy = `{"policy":"bench","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"r1","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"token_bucket","limit":100000000,"window":"1m","scope":"fleet"},` +
	`{"id":"probe","match":{"path_prefix":"/probe/"},"key":["user"],"algorithm":"fixed_window","limit":` + strconv.Itoa(chainK) + `,"window":"1h","scope":"fleet"}]}`

// chainFleetConfig is the fleet variant's plugin configuration: the
// shipped one's control plane (tokens from Envoy's environment).
const chainFleetConfig = `{"env":"dev","control_plane":{"cluster":"control_plane","policy":"bench",` +
	`"token_env":"SLUICE_READ_TOKEN","quota_token_env":"SLUICE_QUOTA_TOKEN","wait":"30s","timeout":"35s"}}`

// chainRule is a token bucket per user at limit a minute, on /api/.
func chainRule(id string, limit int) string {
	return `{"id":"` + id + `","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"token_bucket","limit":` +
		strconv.Itoa(limit) + `,"window":"1m"}`
}

// chainPolicy is a static policy of rules (no control plane).
func chainPolicy(rules ...string) string {
	return `{"env":"bench","policy":{"policy":"bench","version":1,"identity":{"user_header":"x-user-id"},"rules":[` +
		strings.Join(rules, ",") + `]}}`
}

// chainVariants are the benchmark's chains; the C peer's only when its
// module is given.
func chainVariants(withC bool) []chainVariant {
	const never = 100000000 // a limit no run reaches: every request allowed
	five := chainPolicy(chainRule("r1", never), chainRule("r2", never), chainRule("r3", never),
		chainRule("r4", never), chainRule("r5", never))
	peer := `{"limit":` + strconv.Itoa(never) + `}`
	vs := []chainVariant{
		{name: "a_none", k: 0, status: 200},
		{name: "b_local_ratelimit", k: chainK, status: 200, native: true},
		{name: "g_gopeer", k: chainK, status: 200, module: "gopeer", config: peer},
		{name: "s_sluice_1", k: chainK, status: 200, module: "sluice", config: chainPolicy(chainRule("r1", never))},
		{name: "s_sluice_5", k: chainK, status: 200, module: "sluice", config: five},
		{name: "f_sluice_fleet", k: chainK, status: 200, module: "sluice", config: chainFleetConfig, fleet: true},
		{name: "g_gopeer_k1", k: 1, status: 200, module: "gopeer", config: peer},
		{name: "s_sluice_1_k1", k: 1, status: 200, module: "sluice", config: chainPolicy(chainRule("r1", never))},
		{name: "g_gopeer_denied_k1", k: 1, status: 429, module: "gopeer", config: `{"limit":1}`},
		{name: "h_callfloor", k: chainK, status: 200, module: "callfloor", config: `{}`},
		{name: "h_callfloor_k1", k: 1, status: 200, module: "callfloor", config: `{}`},
		{name: "h_callfloor_5", k: chainK, status: 200, module: "callfloor", config: "rules=5"},
		{name: "h_callfloor_denied_k1", k: 1, status: 429, module: "callfloor", config: "deny"},
		{name: "s_sluice_1_denied_k1", k: 1, status: 429, module: "sluice", config: chainPolicy(chainRule("r1", 1))},
	}
	if os.Getenv("SLUICE_BASELINE_WASM") != "" {
		vs = append(vs,
			chainVariant{name: "z_baseline_sluice_1", k: chainK, status: 200, module: "baseline", config: chainPolicy(chainRule("r1", never))},
			chainVariant{name: "z_baseline_sluice_1_k1", k: 1, status: 200, module: "baseline", config: chainPolicy(chainRule("r1", never))},
			chainVariant{name: "z_baseline_sluice_5", k: chainK, status: 200, module: "baseline", config: five},
			chainVariant{name: "z_baseline_sluice_fleet", k: chainK, status: 200, module: "baseline", config: chainFleetConfig, fleet: true},
			chainVariant{name: "z_baseline_sluice_1_denied_k1", k: 1, status: 429, module: "baseline", config: chainPolicy(chainRule("r1", 1))})
	}
	if withC {
		vs = append(vs,
			chainVariant{name: "c_cpeer", k: chainK, status: 200, module: "cpeer", config: peer},
			chainVariant{name: "c_cpeer_k1", k: 1, status: 200, module: "cpeer", config: peer},
			chainVariant{name: "c_cpeer_denied_k1", k: 1, status: 429, module: "cpeer", config: `{"limit":1}`})
	}
	return vs
}

// chainListener is one listener of the bootstrap: v's chain in front of a
// direct_response route answering 200 "ok".
func chainListener(v chainVariant, addr string, modules map[string]string) string {
	host, port, _ := strings.Cut(addr, ":")
	var filters strings.Builder
	for i := range v.k {
		if v.native {
			fmt.Fprintf(&filters, `
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: %s_%d
              token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}
              filter_enabled: {runtime_key: %s_on_%d, default_value: {numerator: 100, denominator: HUNDRED}}
              filter_enforced: {runtime_key: %s_enforce_%d, default_value: {numerator: 100, denominator: HUNDRED}}`,
				v.name, i, v.name, i, v.name, i)
			continue
		}
		cfg, _ := json.Marshal(v.config)
		env := ""
		if v.fleet {
			env = ", environment_variables: {host_env_keys: [SLUICE_READ_TOKEN, SLUICE_QUOTA_TOKEN]}"
		}
		// One vm_id per variant, as Envoy shares a VM between the copies;
		// each copy is its own plugin (root context).
		fmt.Fprintf(&filters, `
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: %s_%d
                root_id: bench
                vm_config: {vm_id: %s, runtime: envoy.wasm.runtime.v8, code: {local: {filename: %q}}%s}
                configuration: {"@type": type.googleapis.com/google.protobuf.StringValue, value: %s}
                failure_policy: FAIL_CLOSED`,
			v.name, i, v.name, modules[v.module], env, cfg)
	}
	return fmt.Sprintf(`
  - name: %s
    address: {socket_address: {address: %s, port_value: %s}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{match: {prefix: "/"}, direct_response: {status: 200, body: {inline_string: "ok"}}}]
          http_filters:%s
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}`,
		v.name, host, port, v.name, filters.String())
}

// startChain runs one Envoy (2 workers) with a listener per variant and
// returns it with the listeners' addresses, in the variants' order. cp is
// the control plane's address, which a fleet variant needs ("" for none).
func startChain(t testing.TB, vs []chainVariant, modules map[string]string, cp string) (*envoyproc.Envoy, []string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("static_resources:\n  listeners:")
	addrs := make([]string, len(vs))
	for i, v := range vs {
		addrs[i] = proctest.FreeAddr(t)
		b.WriteString(chainListener(v, addrs[i], modules))
	}
	if cp != "" {
		host, port, _ := strings.Cut(cp, ":")
		fmt.Fprintf(&b, `
  clusters:
  - name: control_plane
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: control_plane
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}]`, host, port)
	}
	b.WriteString("\n")
	path := filepath.Join(t.TempDir(), "chain.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	e := envoyproc.Start(t, envoyproc.Options{Name: "chain", Root: repo, Config: path, Env: tokens,
		Rewrite: bootstrap.Rewrite{Listeners: addrs, Admin: proctest.FreeAddr(t)}})
	return e, addrs
}

// awaitStat waits until Envoy's admin /stats shows name at value (a
// filter's metric: Envoy strips the wasmcustom prefix there), failing the
// test after 30 s.
func awaitStat(t testing.TB, admin, name, value string) {
	t.Helper()
	want := name + ": " + value
	var last string
	if !proctest.WaitFor(30*time.Second, func() bool {
		resp, err := http.Get("http://" + admin + "/stats?filter=" + regexp.QuoteMeta(name))
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(body)
		for _, line := range strings.Split(last, "\n") {
			if strings.TrimPrefix(line, "wasmcustom.") == want {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("Envoy's %s is not %s after 30 s: %q", name, value, last)
	}
}

// startChainControlPlane starts a control plane (an embedded store) with
// chainFleetPolicy published, when one of vs needs it; it returns its
// address and the policy's version ("", 0 when none does).
func startChainControlPlane(t testing.TB, vs []chainVariant) (string, uint64) {
	t.Helper()
	if !slices.ContainsFunc(vs, func(v chainVariant) bool { return v.fleet }) {
		return "", 0
	}
	cp := startControlPlane(t, "chain control plane", "--data-dir", t.TempDir())
	return cp.addr, proctest.PutPolicy(t, cp.addr, "bench", adminToken, chainFleetPolicy)
}

// chainModules builds the Wasm modules the variants need: sluice's is the
// suite's; gopeer and the call floor are built here; the C peer is
// SLUICE_CPEER_WASM.
func chainModules(t testing.TB) map[string]string {
	t.Helper()
	dir := t.TempDir()
	m := map[string]string{"sluice": filepath.Join(binDir, "sluice.wasm"),
		"gopeer": filepath.Join(dir, "gopeer.wasm"), "callfloor": filepath.Join(dir, "callfloor.wasm")}
	var builds []proctest.Build
	for _, name := range []string{"gopeer", "callfloor"} {
		builds = append(builds, proctest.Build{Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
			Args: []string{"-buildmode=c-shared", "-o", m[name], "./filter/testdata/" + name}})
	}
	if err := proctest.BuildAll(repo, builds...); err != nil {
		t.Fatal(err)
	}
	if c := os.Getenv("SLUICE_CPEER_WASM"); c != "" {
		m["cpeer"] = c
	}
	if c := os.Getenv("SLUICE_BASELINE_WASM"); c != "" {
		m["baseline"] = c
	}
	return m
}

// chainGet sends one GET /api/items as user and returns the status.
func chainGet(t testing.TB, addr, user string) int {
	t.Helper()
	return chainGetPath(t, addr, "/api/items", user)
}

// chainGetPath sends one GET path as user and returns the status.
func chainGetPath(t testing.TB, addr, path, user string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Header.Set("x-user-id", user)
	resp, err := fresh.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestFilterChainConfigurationsAnswer keeps the chain benchmark's
// configurations working (not its timings): one Envoy serves every variant
// on its own listener, and each answers as the benchmark expects: 200
// through K allowing copies, and 429 from a denying one once the user's
// one request a minute is spent.
func TestFilterChainConfigurationsAnswer(t *testing.T) {
	modules := chainModules(t)
	vs := chainVariants(modules["cpeer"] != "")
	cp, _ := startChainControlPlane(t, vs)
	_, addrs := startChain(t, vs, modules, cp)
	for i, v := range vs {
		if v.fleet {
			// The published policy is in force: a user's second probe in
			// the hour is refused by the fleet rule.
			n := 0
			if !proctest.WaitFor(30*time.Second, func() bool {
				n++
				user := "probe-" + strconv.Itoa(n)
				return chainGetPath(t, addrs[i], "/probe/x", user) == 200 && chainGetPath(t, addrs[i], "/probe/x", user) == 429
			}) {
				t.Errorf("%s: the published fleet policy is not in force after 30 s", v.name)
			}
		}
		if v.status == 429 && chainGet(t, addrs[i], "user-1") != 200 {
			t.Errorf("%s: the user's first request was not admitted", v.name)
		}
		if got := chainGet(t, addrs[i], "user-1"); got != v.status {
			t.Errorf("%s: status %d, want %d", v.name, got, v.status)
		}
	}
}

// BenchmarkFilterChain measures the added wall time per request of each
// chain variant in the real Envoy, interleaved: every round runs each
// variant in a fresh Envoy (warm-up, then wrk at 64 connections for
// SLUICE_CHAIN_SECONDS, default 5 s) and the table gives the median over
// SLUICE_CHAIN_ROUNDS rounds (default 5) of each round's added time and of
// its ratio to gopeer (and to the C peer, when given). With
// SLUICE_BASELINE_WASM naming another build of sluice.wasm, the sluice
// variants run with it too (z_baseline_*), for a before-and-after in one
// run. SLUICE_CHAIN_VARIANTS, a regular expression, keeps only the variants
// it matches (and the chain without a filter). A run takes about 12
// minutes, so it runs only when SLUICE_CHAIN_ROUNDS is set, as make
// bench-envoy sets it. Needs wrk
// (Debian's wrk); run it alone, nothing else on the machine:
//
//	make bench-envoy
//	SLUICE_CHAIN_ROUNDS=5 SLUICE_CPEER_WASM=/path/cpeer.wasm go test -run '^$' -bench FilterChain -benchtime 1x -timeout 60m ./testenv/suites/realenvoy/
func BenchmarkFilterChain(b *testing.B) {
	if os.Getenv("SLUICE_CHAIN_ROUNDS") == "" {
		b.Skip("set SLUICE_CHAIN_ROUNDS (make bench-envoy): a run takes minutes")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		b.Skip("no wrk (apt-get install wrk)")
	}
	envoyproc.Binary(b, repo)
	rounds := envInt("SLUICE_CHAIN_ROUNDS", 5)
	secs := envInt("SLUICE_CHAIN_SECONDS", 5)
	modules := chainModules(b)
	vs := chainVariants(modules["cpeer"] != "")
	if only := os.Getenv("SLUICE_CHAIN_VARIANTS"); only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			b.Fatalf("SLUICE_CHAIN_VARIANTS: %v", err)
		}
		vs = slices.DeleteFunc(vs, func(v chainVariant) bool { return v.k != 0 && !re.MatchString(v.name) })
	}
	script := filepath.Join(b.TempDir(), "users.lua")
	if err := os.WriteFile(script, []byte(`local i = 0
request = function() i = i + 1; return wrk.format("GET", "/api/items", {["x-user-id"] = "user-" .. (i % `+
		strconv.Itoa(chainUsers)+`)}) end
`), 0o600); err != nil {
		b.Fatal(err)
	}
	cp, version := startChainControlPlane(b, vs)
	rps := map[string][]float64{} // by variant, one per round
	for range b.N {
		for r := range rounds {
			for _, v := range vs {
				cpv := ""
				if v.fleet {
					cpv = cp
				}
				e, addrs := startChain(b, []chainVariant{v}, modules, cpv)
				if v.fleet { // the filter has the published policy (its only one)
					awaitStat(b, e.Admin, "sluice.policy_version", strconv.FormatUint(version, 10))
				}
				addr := addrs[0]
				// Warm-up: every user's first request (a denying variant's
				// one admitted request), the VMs' code and buffers.
				if out, err := exec.Command(wrk, "-t1", "-c4", "-d2s", "-s", script, "http://"+addr).CombinedOutput(); err != nil {
					b.Fatalf("%s: wrk warm-up: %v\n%s", v.name, err, out)
				}
				if got := chainGet(b, addr, "user-1"); got != v.status {
					b.Fatalf("%s: status %d, want %d", v.name, got, v.status)
				}
				var waits int64
				if v.fleet {
					waits = -chainCounter(b, e.Admin, "sluice.quota.waits")
				}
				out, err := exec.Command(wrk, "-t2", "-c64", "-d"+strconv.Itoa(secs)+"s", "-s", script, "http://"+addr).CombinedOutput()
				if err != nil {
					b.Fatalf("%s: wrk: %v\n%s", v.name, err, out)
				}
				x := wrkRate(b, string(out))
				rps[v.name] = append(rps[v.name], x)
				fmt.Printf("round %d %s: %.0f req/s\n", r+1, v.name, x)
				if v.fleet {
					// A fleet row measures spending from warm leases only
					// while no request waits for a quota call: say how many
					// did (each is a call and a pause).
					waits += chainCounter(b, e.Admin, "sluice.quota.waits")
					fmt.Printf("round %d %s: %d requests waited for a quota call (%.2f %% of %.0f)\n",
						r+1, v.name, waits, 100*float64(waits)/(x*float64(secs)), x*float64(secs))
				}
				e.Kill()
			}
		}
	}
	// On stdout: go test truncates a benchmark's log.
	fmt.Print(chainTable(vs, rps))
}

// chainCounter is the value of Envoy's counter name (a sluice metric, under
// wasmcustom.), 0 if absent. The filter flushes its metrics on tick, so two
// reads a run apart count that run's events shifted by up to a tick.
func chainCounter(t testing.TB, admin, name string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/stats?filter=" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimPrefix(line, "wasmcustom."), name+": "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// chainTable is the benchmark's table: per variant the median over rounds
// of the added µs per filter, and of its ratio to gopeer and the C peer
// with the same k (allowed or denied alike).
func chainTable(vs []chainVariant, rps map[string][]float64) string {
	base := rps["a_none"]
	added := func(name string, k int) []float64 {
		var xs []float64
		for r, x := range rps[name] {
			if r < len(base) && x > 0 && k > 0 {
				xs = append(xs, (1e6/x-1e6/base[r])/float64(k))
			}
		}
		return xs
	}
	// peer is the variant of module with v's k and status (gopeer's or
	// the C peer's for the same kind of request).
	peer := func(v chainVariant, module string) string {
		for _, p := range vs {
			if p.module == module && p.k == v.k && p.status == v.status {
				return p.name
			}
		}
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "a_none: %.0f req/s (median)\n", median(base))
	fmt.Fprintf(&b, "| variant | k | added µs per filter (median) | rounds | × gopeer | × C peer |\n|---|---|---|---|---|---|\n")
	for _, v := range vs {
		if v.k == 0 {
			continue
		}
		xs := added(v.name, v.k)
		ratio := func(module string) string {
			ps := added(peer(v, module), v.k)
			var rs []float64
			for i := range min(len(xs), len(ps)) {
				if ps[i] > 0 {
					rs = append(rs, xs[i]/ps[i])
				}
			}
			if len(rs) == 0 {
				return ""
			}
			return fmt.Sprintf("%.2f", median(rs))
		}
		var each []string
		for _, x := range xs {
			each = append(each, fmt.Sprintf("%.2f", x))
		}
		fmt.Fprintf(&b, "| %s | %d | %.2f | %s | %s | %s |\n", v.name, v.k, median(xs), strings.Join(each, ", "), ratio("gopeer"), ratio("cpeer"))
	}
	return b.String()
}

// median is the median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// wrkRate is the "Requests/sec" of wrk's output; it fails on errors or
// non-2xx/3xx answers (a 429 counts as non-2xx in wrk, so it is not checked
// here: the status was checked before the run).
func wrkRate(t testing.TB, out string) float64 {
	t.Helper()
	m := regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("wrk: no Requests/sec in\n%s", out)
	}
	if strings.Contains(out, "Socket errors") {
		t.Fatalf("wrk: socket errors\n%s", out)
	}
	x, _ := strconv.ParseFloat(m[1], 64)
	return x
}

// envInt is the environment variable name as a positive integer, else def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
