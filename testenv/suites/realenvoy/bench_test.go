package realenvoy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// benchRule is a token bucket per user that never runs dry at benchmark
// rates (limit, else a bucket that is always empty).
func benchRule(id string, limit string) string {
	return `{"id":"` + id + `","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"token_bucket","limit":` + limit + `,"window":"1s"}`
}

// sluiceFilter is the wasm filter of envoy/envoy.yaml with a static policy of
// rules and no control plane.
func sluiceFilter(rules ...string) string {
	return `{"env":"bench","headers":"x-ratelimit","policy":{"policy":"bench","version":1,"identity":{"user_header":"x-user-id"},"rules":[` +
		strings.Join(rules, ",") + `]}}`
}

// The variants of the request-cost benchmark: what runs before the router.
var benchVariants = []struct {
	name   string
	filter func(wasm map[string]any) map[string]any // the http filter that replaces sluice's, nil for none
	status int                                      // what every request gets
	module string                                   // the Wasm module: "sluice", "floor" or none
}{
	{"a_no_filter", func(map[string]any) map[string]any { return nil }, 200, ""},
	{"b_local_ratelimit", func(map[string]any) map[string]any {
		// Envoy's own filter, one token bucket that never runs dry: the
		// cheapest configuration it has (a bucket per user needs route
		// descriptors, which cost more).
		return map[string]any{"name": "envoy.filters.http.local_ratelimit", "typed_config": map[string]any{
			"@type":        "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
			"stat_prefix":  "local_rate_limit",
			"token_bucket": map[string]any{"max_tokens": 1000000000, "tokens_per_fill": 1000000000, "fill_interval": "1s"},
			"filter_enabled": map[string]any{"runtime_key": "lrl_enabled",
				"default_value": map[string]any{"numerator": 100, "denominator": "HUNDRED"}},
			"filter_enforced": map[string]any{"runtime_key": "lrl_enforced",
				"default_value": map[string]any{"numerator": 100, "denominator": "HUNDRED"}}}}
	}, 200, ""},
	{"c_sluice_1_rule", withPolicy(sluiceFilter(benchRule("r1", "1000000000"))), 200, "sluice"},
	{"d_sluice_5_rules", withPolicy(sluiceFilter(benchRule("r1", "1000000000"), benchRule("r2", "1000000000"),
		benchRule("r3", "1000000000"), benchRule("r4", "1000000000"), benchRule("r5", "1000000000"))), 200, "sluice"},
	{"e_sluice_429", withPolicy(sluiceFilter(`{"id":"deny","match":{"path_prefix":"/api/"},"key":["method"],"algorithm":"fixed_window","limit":1,"window":"24h"}`)), 429, "sluice"},
	// The floor: a Go module on the same binding, in the same filter
	// configuration, that reads what sluice's request path reads and decides
	// nothing (filter/testdata/floor). What it adds is what any Go proxy-wasm
	// filter costs in Envoy before deciding anything.
	{"f_go_floor", func(wasm map[string]any) map[string]any { return wasm }, 200, "floor"},
}

// withPolicy returns a filter func that keeps sluice's filter with cfg as its
// plugin configuration.
func withPolicy(cfg string) func(map[string]any) map[string]any {
	return func(wasm map[string]any) map[string]any {
		c := wasm["typed_config"].(map[string]any)["config"].(map[string]any)
		c["configuration"].(map[string]any)["value"] = cfg
		return wasm
	}
}

// BenchmarkRequestThroughEnvoy measures what a request costs through the real
// Envoy (2 workers, file access log as shipped) to the echo upstream, for
// each variant, at 1 and 64 requests in flight over kept-alive connections.
// ns/op is wall time per request (the inverse of throughput); p50-µs is the
// median latency. The added cost of a filter is its ns/op minus
// a_no_filter's at the same concurrency. Run it alone:
//
//	go test -run '^$' -bench RequestThroughEnvoy -benchtime 20000x -count 3 ./testenv/suites/realenvoy/
func BenchmarkRequestThroughEnvoy(b *testing.B) {
	envoyproc.Binary(b, repo)
	floor := filepath.Join(b.TempDir(), "floor.wasm")
	if err := proctest.BuildAll(repo, proctest.Build{Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
		Args: []string{"-buildmode=c-shared", "-o", floor, "./filter/testdata/floor"}}); err != nil {
		b.Fatal(err)
	}
	modules := map[string]string{"sluice": filepath.Join(binDir, "sluice.wasm"), "floor": floor}
	up := startUpstream(b)
	for _, v := range benchVariants {
		cfg := benchBootstrap(b, v.filter)
		var files map[string]string // none: no Wasm filter in this variant
		if v.module != "" {
			files = map[string]string{"build/sluice.wasm": modules[v.module]}
		}
		e := envoyproc.Start(b, envoyproc.Options{Name: v.name, Root: repo, Config: cfg, Env: tokens,
			Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(b)}, Admin: proctest.FreeAddr(b),
				AccessLog: filepath.Join(b.TempDir(), "access.log"),
				Clusters:  map[string]string{"upstream": up, "control_plane": proctest.FreeAddr(b)},
				Files:     files}})
		// One request first: it spends e_sluice_429's one unit, so that every
		// measured request is denied.
		if r, err := fresh.Get("http://" + e.Listener + "/api/warm"); err == nil {
			r.Body.Close()
		}
		for _, c := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/c=%d", v.name, c), func(b *testing.B) { load(b, e.Listener, c, v.status) })
		}
		e.Kill()
	}
}

// benchBootstrap writes envoy/envoy.yaml with sluice's filter replaced by
// filter(sluice's) (removed when nil) and returns its path.
func benchBootstrap(b *testing.B, filter func(map[string]any) map[string]any) string {
	b.Helper()
	src, err := os.ReadFile(filepath.Join(repo, "envoy", "envoy.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	var root map[string]any
	if err := yaml.Unmarshal(src, &root); err != nil {
		b.Fatal(err)
	}
	hcm := root["static_resources"].(map[string]any)["listeners"].([]any)[0].(map[string]any)["filter_chains"].([]any)[0].(map[string]any)["filters"].([]any)[0].(map[string]any)["typed_config"].(map[string]any)
	var out []any
	for _, f := range hcm["http_filters"].([]any) {
		m := f.(map[string]any)
		if m["name"] == "envoy.filters.http.wasm" {
			if r := filter(m); r != nil {
				out = append(out, r)
			}
			continue
		}
		out = append(out, m)
	}
	hcm["http_filters"] = out
	y, err := yaml.Marshal(root)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// load sends b.N GETs to addr from c goroutines, each over its own kept-alive
// connection, users spread over 1,000 ids; every answer must be want.
func load(b *testing.B, addr string, c, want int) {
	tr := &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	var next atomic.Int64
	lat := make([][]time.Duration, c)
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				req, _ := http.NewRequest("GET", "http://"+addr+"/api/items", nil)
				req.Header.Set("X-User-Id", fmt.Sprint("user-", i%1000))
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[g] = append(lat[g], time.Since(t0))
				if resp.StatusCode != want {
					b.Errorf("status %d, want %d", resp.StatusCode, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Nanoseconds())/1e3, "p50-µs")
	}
}
