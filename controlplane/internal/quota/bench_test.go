package quota

import (
	"bytes"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisproc"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// redisCalls sums the calls of every command in INFO commandstats but INFO itself.
func redisCalls(b *testing.B, addr string) uint64 {
	out, err := redisproc.Command(addr, "INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		v, _ := strconv.ParseUint(calls, 10, 64)
		n += v
	}
	return n
}

// BenchmarkQuotaGrants measures one replica over loopback HTTP with a real
// redis-server: batches of 1, 10 and 100 keys of a fixed_window fleet rule, each
// key asked for one unit. It reports key-grants/s, p50/p99 request latency and Redis
// commands per granted key. "parallel" runs 4 Envoys at once.
func BenchmarkQuotaGrants(b *testing.B) {
	rs := redisproc.Start(b)
	client := redisClient(rs.Addr())
	defer client.Close()
	pol := newPolicies(b)
	s := New(Options{Backend: NewRedis(client), Policies: pol, Open: true})
	srv := serve(b, s)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, tc := range []struct {
		name    string
		batch   int
		clients int
	}{{"batch=1", 1, 1}, {"batch=10", 10, 1}, {"batch=100", 100, 1}, {"batch=100/parallel=4", 100, 4}} {
		b.Run(tc.name, func(b *testing.B) {
			var mu sync.Mutex
			var lat []time.Duration
			var granted uint64
			next := 0
			body := func(envoy string, i int) []byte {
				req := &quota.Request{Envoy: envoy, Policy: "p", Version: 1, Env: testEnv}
				for j := 0; j < tc.batch; j++ {
					k := (i*tc.batch + j) % 50000
					req.Keys = append(req.Keys, quota.KeyRequest{Rule: "keyed",
						Key: "rl:t:p/keyed:ip=10.1." + strconv.Itoa(k/250) + "." + strconv.Itoa(k%250) + ":60s", Want: 1})
				}
				return quota.AppendRequest(nil, req)
			}
			before := redisCalls(b, rs.Addr())
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for c := 0; c < tc.clients; c++ {
				wg.Add(1)
				go func(c int) {
					defer wg.Done()
					for {
						mu.Lock()
						if next >= b.N {
							mu.Unlock()
							return
						}
						i := next
						next++
						mu.Unlock()
						doc := body("envoy-"+strconv.Itoa(c), i)
						t0 := time.Now()
						res, err := hc.Post(srv.URL+"/v1/quota", "application/json", bytes.NewReader(doc))
						if err != nil {
							b.Error(err)
							return
						}
						data, _ := io.ReadAll(res.Body)
						res.Body.Close()
						d := time.Since(t0)
						resp, err := quota.DecodeResponse(data)
						if err != nil || res.StatusCode != 200 {
							b.Errorf("%d %s", res.StatusCode, data)
							return
						}
						var g uint64
						for _, k := range resp.Keys {
							if k.Granted > 0 {
								g++
							}
						}
						mu.Lock()
						lat = append(lat, d)
						granted += g
						mu.Unlock()
					}
				}(c)
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			after := redisCalls(b, rs.Addr())
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
			}
			b.ReportMetric(float64(granted)/elapsed.Seconds(), "key-grants/s")
			if granted > 0 {
				b.ReportMetric(float64(after-before)/float64(granted), "redis-cmds/key")
			}
		})
	}
}
