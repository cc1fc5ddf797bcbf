package fleetquota

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// BenchmarkQuotaThousandsOfEnvoys: n simulated Envoys share one counter key of a
// fleet rule (10^8 an hour, never spent: a refusal is always a false one), each
// calling POST /v1/quota once a second at its own offset within the second, asking
// for 5 units and reporting what it was granted last as used, as the filter does.
// Two control-plane processes share one redis-server; Envoy i calls replica i mod 2.
// One op is one second of the whole fleet (n calls):
//
//	make build && go test ./testenv/suites/fleetquota -run '^$' -bench ThousandsOfEnvoys -benchtime 10x
//
// It reports per call: refused, retry and 5xx answers, p50 and p99 latency, Redis
// bytes (received and sent by the redis-server, from INFO stats), the two
// replicas' CPU time (from /proc) and the redis-server's (INFO cpu); and the
// Redis memory of the key (MEMORY USAGE). The http-floor cases send the same calls to two
// processes that answer each with a fixed body (serveFloor): what one HTTP call
// per Envoy and second costs this machine with nothing decided and no Redis.
func BenchmarkQuotaThousandsOfEnvoys(b *testing.B) {
	for _, n := range []int{10, 1000, 5000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchEnvoysOnOneKey(b, n) })
	}
	for _, n := range []int{5000, 10000} {
		b.Run("http-floor-"+strconv.Itoa(n), func(b *testing.B) { benchHTTPFloor(b, n) })
	}
}

// floorListenEnv, when set, makes the test binary an HTTP floor server on that
// address (serveFloor) instead of running tests.
const floorListenEnv = "SLUICE_BENCH_FLOOR_LISTEN"

// floorAnswer is what the floor server answers every call: a quota answer of the
// size the control plane sends.
var floorAnswer = []byte(`{"policy":"default","version":1,"now":1,"keys":[{"key":"rl:dev:default/search:*:3600s","status":"granted","granted":5,"held":5,"expires_in_ms":1000,"envoys":2}]}`)

// serveFloor serves floorAnswer to every request on addr: net/http with nothing
// decided, the least a replica answering one HTTP call can cost.
func serveFloor(addr string) {
	_ = http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(floorAnswer)
	}))
}

// benchHTTPFloor runs the fleet's calls against two floor servers (this test
// binary run as serveFloor).
func benchHTTPFloor(b *testing.B, n int) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var procs []*proctest.Proc
	var addrs []string
	for range 2 {
		addr := proctest.FreeAddr(b)
		p := proctest.Start(b, proctest.Spec{Name: "floor", Bin: self, Env: []string{floorListenEnv + "=" + addr}})
		proctest.AwaitListening(b, addr, 15*time.Second, p)
		procs, addrs = append(procs, p), append(addrs, addr)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 8192}}
	body := quota.AppendRequest(nil, &quota.Request{Envoy: "envoy-0", Policy: policyName, Version: 1, Env: "dev", Interval: time.Second,
		Keys: []quota.KeyRequest{{Rule: "search", Key: "rl:dev:default/search:*:3600s", Want: 5}}})
	ask := func(i int, _ uint64) (quota.KeyResult, string, time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addrs[i%2]+"/v1/quota", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return quota.KeyResult{}, "error", time.Since(t0)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if resp.StatusCode != http.StatusOK {
			return quota.KeyResult{}, strconv.Itoa(resp.StatusCode/100) + "xx", d
		}
		return quota.KeyResult{}, quota.StatusGranted, d
	}
	cpu := func() time.Duration { return procs[0].CPUTime() + procs[1].CPUTime() }
	runFleet(b, n, ask, cpu, nil)
}

const scalePolicy = `{"policy":"` + policyName + `","identity":{"user_header":"x-user"},"rules":[` +
	`{"id":"search","match":{"path_prefix":"/search"},"algorithm":"fixed_window","limit":100000000,"window":"1h","scope":"fleet"}]}`

func benchEnvoysOnOneKey(b *testing.B, n int) {
	rs := redisproc.Start(b)
	cps := []*controlPlane{startControlPlane(b, rs.Addr()), startControlPlane(b, rs.Addr())}
	version := cps[0].put(scalePolicy)
	key := proctest.UnkeyedCounterKey(b, scalePolicy, "dev", 0)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 8192}}
	ask := func(i int, used uint64) (quota.KeyResult, string, time.Duration) {
		body := quota.AppendRequest(nil, &quota.Request{Envoy: "envoy-" + strconv.Itoa(i), Policy: policyName, Version: version,
			Env: "dev", Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "search", Key: key, Used: used, Want: 5}}})
		req, _ := http.NewRequest(http.MethodPost, "http://"+cps[i%2].addr+"/v1/quota", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+quotaToken)
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return quota.KeyResult{}, "error", time.Since(t0)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if resp.StatusCode != http.StatusOK {
			return quota.KeyResult{}, strconv.Itoa(resp.StatusCode/100) + "xx", d
		}
		r, err := quota.DecodeResponse(data)
		if err != nil || len(r.Keys) != 1 {
			return quota.KeyResult{}, "error", d
		}
		return r.Keys[0], r.Keys[0].Status, d
	}
	// Every Envoy joins the key once before the clock starts, 32 at a time.
	var joined sync.WaitGroup
	joinErr := make(chan string, n)
	for w := 0; w < 32; w++ {
		joined.Add(1)
		go func(w int) {
			defer joined.Done()
			for i := w; i < n; i += 32 {
				if _, st, _ := ask(i, 0); st != quota.StatusGranted {
					joinErr <- "Envoy " + strconv.Itoa(i) + " joining the key: " + st
				}
			}
		}(w)
	}
	joined.Wait()
	close(joinErr)
	joinFailed := 0
	for range joinErr {
		joinFailed++
	}
	b.Logf("%d Envoys joined the key, %d of them not granted at once", n, joinFailed)
	cpu := func() time.Duration { return cps[0].p.CPUTime() + cps[1].p.CPUTime() }
	redisCPU := redisInfo(b, rs.Addr(), "cpu", "used_cpu_sys", "used_cpu_user")
	runFleet(b, n, ask, cpu, func() int64 {
		return int64(redisInfo(b, rs.Addr(), "stats", "total_net_input_bytes", "total_net_output_bytes"))
	})
	calls := float64(n * b.N)
	b.ReportMetric((redisInfo(b, rs.Addr(), "cpu", "used_cpu_sys", "used_cpu_user")-redisCPU)*1e6/calls, "redis-cpu-µs/call")
	keys, err := redisproc.Command(rs.Addr(), "KEYS", "{}sq*")
	if err != nil || strings.Count(keys, "\n") != 0 || keys == "" {
		b.Fatalf("the quota keys in Redis: %q %v (want one)", keys, err)
	}
	mem, err := redisproc.Command(rs.Addr(), "MEMORY", "USAGE", keys, "SAMPLES", "0")
	if err != nil {
		b.Fatal(err)
	}
	size, _ := strconv.ParseFloat(mem, 64)
	b.ReportMetric(size, "key-bytes")
}

// runFleet runs n Envoys calling ask once a second each, at their own offsets in
// the second, for b.N seconds, and reports the answers, latency, CPU time of the
// replicas (cpu) and, when redisBytes is set, Redis traffic per call.
func runFleet(b *testing.B, n int, ask func(i int, used uint64) (quota.KeyResult, string, time.Duration), cpu func() time.Duration, redisBytes func() int64) {
	var netBefore int64
	if redisBytes != nil {
		netBefore = redisBytes()
	}
	cpuBefore := cpu()
	var mu sync.Mutex
	statuses := map[string]int{}
	lat := make([]time.Duration, 0, n*b.N)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var used uint64
			for k := 0; k < b.N; k++ {
				at := start.Add(time.Duration(k)*time.Second + time.Duration(i)*time.Second/time.Duration(n))
				time.Sleep(time.Until(at)) // the Envoy's report schedule, not a wait for an event
				r, st, d := ask(i, used)
				used = r.Granted
				mu.Lock()
				statuses[st]++
				lat = append(lat, d)
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	calls := float64(len(lat))
	if redisBytes != nil {
		b.ReportMetric(float64(redisBytes()-netBefore)/calls, "redis-B/call")
	}
	b.ReportMetric(float64((cpu()-cpuBefore).Microseconds())/calls, "replica-cpu-µs/call")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	for _, st := range []string{quota.StatusRefused, quota.StatusRetry, "5xx", "error"} {
		b.ReportMetric(float64(statuses[st])/calls, st+"/call")
	}
	b.Logf("%d Envoys, %d calls by status: %v", n, len(lat), statuses)
}

// redisInfo is the sum of the named fields of INFO section at the redis-server at
// addr (counters as integers, CPU times in seconds).
func redisInfo(b *testing.B, addr, section string, names ...string) float64 {
	out, err := redisproc.Command(addr, "INFO", section)
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(out, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && slices.Contains(names, name) {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += n
		}
	}
	return sum
}
