package fleetquota

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisproc"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// BenchmarkQuotaThousandsOfEnvoys: n simulated Envoys share one counter key of a
// fleet rule (10^8 an hour, never spent: a refusal is always a false one), each
// calling POST /v1/quota once a second at its own offset within the second, asking
// for 5 units and reporting what it was granted last as used, as the filter does.
// Two control-plane processes share one redis-server; Envoy i calls replica i mod 2.
// One op is one second of the whole fleet (n calls):
//
//	make build && go test ./testenv/fleetquota -run '^$' -bench ThousandsOfEnvoys -benchtime 10x
//
// It reports per call: refused, retry and 5xx answers, p50 and p99 latency, Redis
// bytes (received and sent by the redis-server, from INFO stats) and the two
// replicas' CPU time (from /proc).
func BenchmarkQuotaThousandsOfEnvoys(b *testing.B) {
	for _, n := range []int{1000, 5000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchEnvoysOnOneKey(b, n) })
	}
}

const scalePolicy = `{"policy":"` + policyName + `","identity":{"user_header":"x-user"},"rules":[` +
	`{"id":"search","match":{"path_prefix":"/search"},"algorithm":"fixed_window","limit":100000000,"window":"1h","scope":"fleet"}]}`

func benchEnvoysOnOneKey(b *testing.B, n int) {
	rs := redisproc.Start(b)
	cps := []*controlPlane{startControlPlane(b, rs.Addr()), startControlPlane(b, rs.Addr())}
	version := cps[0].put(scalePolicy)
	key := scaleKey(b)
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
	netBefore := redisNetBytes(b, rs.Addr())
	cpuBefore := cps[0].p.CPUTime() + cps[1].p.CPUTime()
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
	b.ReportMetric(float64(redisNetBytes(b, rs.Addr())-netBefore)/calls, "redis-B/call")
	b.ReportMetric(float64((cps[0].p.CPUTime()+cps[1].p.CPUTime()-cpuBefore).Microseconds())/calls, "replica-cpu-µs/call")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	for _, st := range []string{quota.StatusRefused, quota.StatusRetry, "5xx", "error"} {
		b.ReportMetric(float64(statuses[st])/calls, st+"/call")
	}
	b.Logf("%d Envoys, %d calls by status: %v", n, len(lat), statuses)
}

// scaleKey is the counter key of scalePolicy's one rule, as the filter builds it.
func scaleKey(b *testing.B) string {
	p, err := rules.ParsePolicy([]byte(scalePolicy))
	if err != nil {
		b.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{Env: "dev"})
	if err != nil {
		b.Fatal(err)
	}
	k, ok := c.AppendKey(nil, 0, &rules.Request{})
	if !ok {
		b.Fatal("no key")
	}
	return string(k)
}

// redisNetBytes is what the redis-server at addr has received and sent over the
// network so far (INFO stats: total_net_input_bytes + total_net_output_bytes).
func redisNetBytes(b *testing.B, addr string) int64 {
	out, err := redisproc.Command(addr, "INFO", "stats")
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	for _, line := range strings.Split(out, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "total_net_input_bytes" || name == "total_net_output_bytes") {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += n
		}
	}
	return sum
}
