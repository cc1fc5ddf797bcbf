package rls

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// BenchmarkShouldRateLimit measures one replica over loopback gRPC with a real
// redis-server and the real clock: 32 calls in flight, each one descriptor
// (generic_key=bench, user=u<n>) of a fixed window of 10^8 per second, n over
// 1,000 keys (warm after the first window) or one key. It reports decisions/s,
// asks of the quota service per decision and the p50/p99 call latency.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, keys := range []int{1, 1000} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			f := &fixture{pol: &policies{}, redis: redisproc.Start(b)}
			f.pol.set(b, `{"policy":"bench","rules":[{"id":"u","descriptor":{"domain":"bench","entries":[{"key":"generic_key","value":"bench"},{"key":"user"}]},"algorithm":"fixed_window","limit":100000000,"window":"1s","scope":"fleet"}]}`)
			r := f.replica(b, "bench", "")
			ds := make([]*commonrl.RateLimitDescriptor, keys)
			for i := range ds {
				ds[i] = desc("generic_key", "bench", "user", "u"+strconv.Itoa(i))
			}
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < 32; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							break
						}
						t0 := time.Now()
						resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: ds[int(n)%keys : int(n)%keys+1]})
						if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
							b.Errorf("call: %v %v", resp, err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			if len(lat) > 0 {
				b.ReportMetric(float64(len(lat))/el.Seconds(), "decisions/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(counterWith(nil, r.reg, "sluice_controlplane_rls_asks_total", "", "")/float64(len(lat)), "asks/decision")
			}
		})
	}
}
