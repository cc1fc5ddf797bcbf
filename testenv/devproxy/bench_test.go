package devproxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchConcurrency is the number of clients the load generator runs.
const benchConcurrency = 16

// BenchmarkDevProxy measures the dev proxy on loopback with the filter and
// one rule (a token bucket on the client IP, large enough never to deny)
// against the same proxy without a filter, in one run, with a closed-loop
// Go load generator of benchConcurrency clients. It reports each mode's
// requests per second and p99 latency, and their ratio. Needs
// build/sluice.wasm (make wasm; make bench builds it):
//
//	go test -run '^$' -bench DevProxy -benchtime 20000x ./testenv/devproxy/
func BenchmarkDevProxy(b *testing.B) {
	wasm, err := os.ReadFile("../../build/sluice.wasm")
	if err != nil {
		b.Skip("build/sluice.wasm missing: run make wasm")
	}
	c, err := LoadEnvoyConfig("../../envoy/envoy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"ok":true}`))
	}))
	defer up.Close()
	oneRule := *c
	f := *c.Filter
	f.PluginConfig = []byte(`{"env":"bench","policy":{"policy":"bench","rules":[{"id":"per-ip","key":["client_ip"],
		"algorithm":"token_bucket","limit":1000000000,"window":"1s"}]}}`)
	oneRule.Filter = &f

	run := func(withFilter bool) (rps float64, p99 time.Duration) {
		o := Options{Config: &oneRule, Upstream: up.Listener.Addr().String(), Workers: 2, AccessLog: io.Discard}
		if withFilter {
			o.Wasm = wasm
		}
		p, err := New(context.Background(), o)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		srv := httptest.NewServer(p)
		defer srv.Close()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency}}
		defer client.CloseIdleConnections()
		get := func() time.Duration {
			t0 := time.Now()
			resp, err := client.Get(srv.URL + "/api/bench")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
			return time.Since(t0)
		}
		for i := 0; i < 200; i++ { // warm up connections and VMs
			get()
		}
		lat := make([]time.Duration, b.N)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < benchConcurrency; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(b.N) {
						return
					}
					lat[i] = get()
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		slices.Sort(lat)
		return float64(b.N) / elapsed.Seconds(), lat[len(lat)*99/100]
	}
	b.ResetTimer()
	base, baseP99 := run(false)
	filt, filtP99 := run(true)
	b.StopTimer()
	b.ReportMetric(filt, "filter_req/s")
	b.ReportMetric(base, "nofilter_req/s")
	b.ReportMetric(filt/base, "ratio")
	b.ReportMetric(float64(filtP99.Microseconds())/1000, "filter_p99_ms")
	b.ReportMetric(float64(baseP99.Microseconds())/1000, "nofilter_p99_ms")
}
