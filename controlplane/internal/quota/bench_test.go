package quota

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/tlsconf"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

// redisCalls sums the calls of every command in INFO commandstats but INFO itself.
func redisCalls(b *testing.B, addr string) uint64 {
	c, err := redisproc.CommandCalls(addr)
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	for name, v := range c {
		if name != "info" {
			n += v
		}
	}
	return n
}

// BenchmarkQuotaGrants measures one replica over loopback HTTP/1.1 with a real
// redis-server: batches of 1, 10 and 100 keys of a fixed_window fleet rule, each
// key asked for one unit. It reports key-grants/s, p50/p99 request latency and Redis
// commands per granted key. "parallel" runs 4 Envoys at once. Each case runs over
// plain HTTP (quota token mode) and over mTLS (HTTPS, each Envoy identified by its
// client certificate), on kept-alive connections as Envoy's cluster pool keeps them.
func BenchmarkQuotaGrants(b *testing.B) {
	rs := redisproc.Start(b)
	client := redisClient(rs.Addr())
	defer client.Close()
	pol := newPolicies(b)
	plain := serve(b, New(Options{Backend: NewRedis(client), Policies: pol, Open: true}))
	mtls, mtlsClient := serveMTLS(b, New(Options{Backend: NewRedis(client), Policies: pol, Identity: IdentityCertificate}))
	for _, tc := range []struct {
		name    string
		batch   int
		clients int
	}{{"batch=1", 1, 1}, {"batch=10", 10, 1}, {"batch=100", 100, 1}, {"batch=100/parallel=4", 100, 4}} {
		for _, tr := range []struct {
			name string
			url  string
			hc   *http.Client
		}{{"plain", plain.URL, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}, {"mtls", mtls.URL, mtlsClient}} {
			b.Run(tr.name+"/"+tc.name, func(b *testing.B) {
				benchGrants(b, rs.Addr(), tr.url, tr.hc, tc.batch, tc.clients)
			})
		}
	}
}

// serveMTLS serves s over HTTPS with the control plane's TLS (tlsconf) and a client
// CA, and returns an Envoy's client: HTTP/1.1, kept alive, presenting a certificate
// with a SPIFFE URI SAN.
func serveMTLS(b *testing.B, s *Service) (*httptest.Server, *http.Client) {
	dir := b.TempDir()
	ca := testpki.NewCA(b, "bench")
	certFile, keyFile := ca.Server(b).Write(b, dir, "server")
	ts, err := tlsconf.New(tlsconf.Files{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.WriteCA(b, dir, "ca")}, nil)
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/quota", s)
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = ts.Config()
	srv.StartTLS()
	b.Cleanup(srv.Close)
	cert := ca.Issue(b, testpki.Leaf{URIs: []string{"spiffe://bench/ns/edge/sa/envoy"}}).TLS(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, TLSClientConfig: &tls.Config{RootCAs: ca.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}}}
	return srv, hc
}

// benchGrants runs b.N quota calls of batch keys each from clients Envoys at once
// against url, and reports the figures of BenchmarkQuotaGrants.
func benchGrants(b *testing.B, redisAddr, url string, hc *http.Client, batch, clients int) {
	var mu sync.Mutex
	var lat []time.Duration
	var granted uint64
	next := 0
	body := func(envoy string, i int) []byte {
		req := &quota.Request{Envoy: envoy, Policy: "p", Version: 1, Env: testEnv}
		for j := 0; j < batch; j++ {
			k := (i*batch + j) % 50000
			req.Keys = append(req.Keys, quota.KeyRequest{Rule: "keyed",
				Key: "rl:t:p/keyed:ip=10.1." + strconv.Itoa(k/250) + "." + strconv.Itoa(k%250) + ":60s", Want: 1})
		}
		return quota.AppendRequest(nil, req)
	}
	before := redisCalls(b, redisAddr)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
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
				res, err := hc.Post(url+"/v1/quota", "application/json", bytes.NewReader(doc))
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
	after := redisCalls(b, redisAddr)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(granted)/elapsed.Seconds(), "key-grants/s")
	if granted > 0 {
		b.ReportMetric(float64(after-before)/float64(granted), "redis-cmds/key")
	}
}

// hotAsk is one simulated Envoy's quota call on the hot key: it reports what it
// was granted last time as used and asks for 5 units. It returns the answer's
// status ("5xx" for an HTTP error) and latency.
func hotAsk(b *testing.B, hc *http.Client, url, envoy string, used uint64) (quota.KeyResult, string, time.Duration) {
	doc := quota.AppendRequest(nil, &quota.Request{Envoy: envoy, Policy: "h", Version: 1, Env: testEnv, Interval: time.Second,
		Keys: []quota.KeyRequest{{Rule: "hot", Key: hotKey, Used: used, Want: 5}}})
	t0 := time.Now()
	res, err := hc.Post(url+"/v1/quota", "application/json", bytes.NewReader(doc))
	if err != nil {
		b.Error(err)
		return quota.KeyResult{}, "error", 0
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	d := time.Since(t0)
	if res.StatusCode != http.StatusOK {
		return quota.KeyResult{}, strconv.Itoa(res.StatusCode/100) + "xx", d
	}
	resp, err := quota.DecodeResponse(data)
	if err != nil {
		b.Error(err)
		return quota.KeyResult{}, "error", d
	}
	return resp.Keys[0], resp.Keys[0].Status, d
}

// hotStack is two replicas (their production timeout, 250 ms) on one real
// redis-server over loopback HTTP, with policy h (one key, limit 10^8 a minute).
func hotStack(b *testing.B) []string {
	rs := redisproc.Start(b)
	p := newPolicies(b)
	p.set(b, hotPolicyDoc)
	var urls []string
	for i := 0; i < 2; i++ {
		c := redisClient(rs.Addr())
		b.Cleanup(func() { c.Close() })
		urls = append(urls, serve(b, New(Options{Backend: NewRedis(c), Policies: p, Open: true})).URL)
	}
	return urls
}

// report logs the answers by status and reports refused, retry and 5xx per
// answer and the p50/p99 latency.
func reportHot(b *testing.B, statuses map[string]int, lat []time.Duration) {
	n := 0
	for _, v := range statuses {
		n += v
	}
	b.Logf("%d answers by status: %v", n, statuses)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
	}
	if n > 0 {
		b.ReportMetric(float64(statuses[quota.StatusRefused])/float64(n), "refused/answer")
		b.ReportMetric(float64(statuses[quota.StatusRetry])/float64(n), "retry/answer")
		b.ReportMetric(float64(statuses["5xx"])/float64(n), "5xx/answer")
	}
}

// BenchmarkQuotaHotKey: 128 Envoys ask for one key in a tight loop, each
// alternating between two replicas on one redis-server (limit 10^8: the budget
// is never spent, so a refusal is always a false one). One op is one answer.
func BenchmarkQuotaHotKey(b *testing.B) {
	urls := hotStack(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	const clients = 128
	var mu sync.Mutex
	statuses := map[string]int{}
	var lat []time.Duration
	next := 0
	b.ResetTimer()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			var used uint64
			for n := 0; ; n++ {
				mu.Lock()
				if next >= b.N {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				r, st, d := hotAsk(b, hc, urls[(c+n)%2], "envoy-"+strconv.Itoa(c), used)
				used = r.Granted
				mu.Lock()
				statuses[st]++
				lat = append(lat, d)
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	b.StopTimer()
	reportHot(b, statuses, lat)
}

// BenchmarkQuotaThousandEnvoys: 1,000 Envoys each report on one key once a
// second (their quota_interval), spread over the second, half of them through
// each of two replicas on one redis-server. One op is one second of the fleet:
// 1,000 answers.
func BenchmarkQuotaThousandEnvoys(b *testing.B) {
	urls := hotStack(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	const envoys = 1000
	var mu sync.Mutex
	statuses := map[string]int{}
	var lat []time.Duration
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for e := 0; e < envoys; e++ {
		wg.Add(1)
		go func(e int) {
			defer wg.Done()
			var used uint64
			for n := 0; n < b.N; n++ {
				// Envoy e reports at second n plus its own offset within the second.
				at := start.Add(time.Duration(n)*time.Second + time.Duration(e)*time.Second/envoys)
				time.Sleep(time.Until(at)) // the report's schedule, not a wait for an event
				r, st, d := hotAsk(b, hc, urls[e%2], "envoy-"+strconv.Itoa(e), used)
				used = r.Granted
				mu.Lock()
				statuses[st]++
				lat = append(lat, d)
				mu.Unlock()
			}
		}(e)
	}
	wg.Wait()
	b.StopTimer()
	reportHot(b, statuses, lat)
}
