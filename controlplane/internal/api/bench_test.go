package api_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// The benchmarks measure the service on loopback with a real Redis (started
// by the benchmark). They only run with -bench; see controlplane/README.md
// for the commands and the figures.

func rawClient(conns int) *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxIdleConns: conns, IdleConnTimeout: time.Minute}}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func report(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(lat, 0.50)), "p50-ms")
	b.ReportMetric(ms(percentile(lat, 0.99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}

func get(b *testing.B, c *http.Client, url string, headers ...string) (int, []byte) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func put(b *testing.B, c *http.Client, url string, body []byte) int {
	req, _ := http.NewRequest("PUT", url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// BenchmarkPollGET is the filter's steady-state poll: GET with the current
// ETag in If-None-Match (304), sent open-loop at a fixed 1,000 requests per
// second; latency is measured from each request's scheduled send time, so a
// stall is not hidden by the sender waiting (no coordinated omission).
// Reports p50/p99/max in milliseconds. Use -benchtime=5000x (5 s).
func BenchmarkPollGET(b *testing.B) {
	be := redisBackend(b, redisproc.Options{})
	r := startReplica(b, be)
	c := rawClient(64)
	if put(b, c, r.ts.URL+"/v1/policies/p", policyDoc("p", 1)) != 201 {
		b.Fatal("create failed")
	}
	tag := r.admin.Do("GET", "/v1/policies/p", nil).ETag()
	const rate = 1000 // requests per second
	interval := time.Second / rate
	lat := make([]time.Duration, b.N)
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		due := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(due))
		sem <- struct{}{}
		wg.Add(1)
		go func(i int, due time.Time) {
			defer wg.Done()
			defer func() { <-sem }()
			if code, _ := get(b, c, r.ts.URL+"/v1/policies/p", "If-None-Match", tag); code != 304 {
				b.Errorf("status %d", code)
			}
			lat[i] = time.Since(due)
		}(i, due)
	}
	wg.Wait()
	b.StopTimer()
	report(b, lat)
}

// BenchmarkWake1000 opens 1,000 long polls, then PUTs a new version and
// measures, for every poll, the time from sending the PUT to receiving the
// new version. "local": polls and PUT on one replica; "replica": polls on
// one replica, PUT through another on the same Redis (pub/sub). Reports
// p50/p99/max over all polls of all iterations, in milliseconds.
func BenchmarkWake1000(b *testing.B) {
	for _, mode := range []string{"local", "replica"} {
		b.Run(mode, func(b *testing.B) {
			be := redisBackend(b, redisproc.Options{})
			pollers := startReplica(b, be)
			writer := pollers
			if mode == "replica" {
				writer = startReplica(b, be)
			}
			const n = 1000
			c := rawClient(n + 16)
			if put(b, c, writer.ts.URL+"/v1/policies/p", policyDoc("p", 1)) != 201 {
				b.Fatal("create failed")
			}
			var lat []time.Duration
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				b.StopTimer()
				version := it + 1
				tag := fmt.Sprintf(`"v%d"`, version)
				// Wait until the polling replica has this version.
				for {
					if code, _ := get(b, c, pollers.ts.URL+"/v1/policies/p", "If-None-Match", tag); code == 304 {
						break
					}
					time.Sleep(time.Millisecond)
				}
				done := make([]time.Time, n)
				var wg sync.WaitGroup
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						code, _ := get(b, c, pollers.ts.URL+"/v1/policies/p?wait=60s", "If-None-Match", tag)
						done[i] = time.Now()
						if code != 200 {
							b.Errorf("poll %d: status %d", i, code)
						}
					}(i)
				}
				waitWatchersB(b, pollers, n)
				b.StartTimer()
				sent := time.Now()
				if code := put(b, c, writer.ts.URL+"/v1/policies/p", policyDoc("p", version+1)); code != 200 {
					b.Fatalf("PUT → %d", code)
				}
				wg.Wait()
				for _, d := range done {
					lat = append(lat, d.Sub(sent))
				}
			}
			b.StopTimer()
			report(b, lat)
		})
	}
}

func waitWatchersB(b *testing.B, r *replica, n int) {
	want := []byte(fmt.Sprintf("sluice_controlplane_watchers %d\n", n))
	c := rawClient(1)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, body := get(b, c, r.ts.URL+"/metrics"); bytes.Contains(body, want) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.Fatalf("never saw %d watchers", n)
}

// BenchmarkWrites measures policy writes through the API into Redis (each a
// read, a validation and one Lua script): "serial" is one writer,
// "parallel" many writers on distinct policies. Reports writes/s.
func BenchmarkWrites(b *testing.B) {
	for _, mode := range []string{"serial", "parallel"} {
		b.Run(mode, func(b *testing.B) {
			r := startReplica(b, redisBackend(b, redisproc.Options{}))
			c := rawClient(64)
			var mu sync.Mutex
			next := 0
			b.ResetTimer()
			start := time.Now()
			if mode == "serial" {
				for i := 0; i < b.N; i++ {
					if code := put(b, c, r.ts.URL+"/v1/policies/p", policyDoc("p", i+1)); code != 200 && code != 201 {
						b.Fatalf("PUT → %d", code)
					}
				}
			} else {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					mu.Lock()
					name := fmt.Sprint("p", next)
					next++
					mu.Unlock()
					for i := 1; pb.Next(); i++ {
						if code := put(b, c, r.ts.URL+"/v1/policies/"+name, policyDoc(name, i)); code != 200 && code != 201 {
							b.Errorf("PUT → %d", code)
							return
						}
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
		})
	}
}
