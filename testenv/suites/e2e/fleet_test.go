package e2e

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

const quotaToken = "e2e-quota-token"

// fleetStack is two control-plane replicas on one redis-server and three
// dev proxies (2 workers each), each proxy's control_plane cluster on one
// replica.
type fleetStack struct {
	t       *testing.T
	cpAddrs []string
	proxies []string
	scheme  string       // of the control planes: http, or https with mTLS
	cp      *http.Client // the client of the control planes' admin API
}

func startFleetStack(t *testing.T) *fleetStack { return startFleetStackWith(t, false) }

// startFleetStackWith starts the stack; with mtls the control planes serve HTTPS,
// verify client certificates against a CA the test makes, and have no quota token:
// each proxy follows envoy/envoy-mtls.yaml with a certificate of its own (URI SAN
// spiffe://sluice.test/ns/e2e/sa/proxy-<i>).
func startFleetStackWith(t *testing.T, mtls bool) *fleetStack {
	t.Helper()
	s := &fleetStack{t: t, scheme: "http", cp: http.DefaultClient}
	redisAddr := proctest.FreeAddr(t)
	startRedis(t, redisAddr, t.TempDir())
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken}
	var tlsArgs []string
	var ca *testpki.CA
	pki := t.TempDir()
	if mtls {
		ca = testpki.NewCA(t, "sluice e2e")
		srv := ca.Issue(t, testpki.Leaf{CommonName: "sluice-controlplane", DNS: []string{"sluice-controlplane"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		certFile, keyFile := srv.Write(t, pki, "server")
		tlsArgs = []string{"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--client-ca-file", ca.WriteCA(t, pki, "ca")}
		s.scheme = "https"
		s.cp = &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "sluice-controlplane"}}}
	} else {
		tokens = append(tokens, "SLUICE_QUOTA_TOKEN="+quotaToken)
	}
	for i := 0; i < 2; i++ {
		addr := proctest.FreeAddr(t)
		p := startProc(t, "control plane "+strconv.Itoa(i), filepath.Join(binDir, "sluice-controlplane"),
			append([]string{"--listen", addr, "--log-level", "warn", "--resync-interval", "200ms", "--redis-url", "redis://" + redisAddr}, tlsArgs...), tokens)
		if !proctest.WaitFor(readyTimeout, func() bool {
			resp, err := s.cp.Get(s.scheme + "://" + addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		}) {
			t.Fatalf("control plane %d not ready:\n%s", i, p.Output())
		}
		s.cpAddrs = append(s.cpAddrs, addr)
	}
	up := proctest.FreeAddr(t)
	echo := startProc(t, "upstream", filepath.Join(binDir, "sluice-echo"), []string{"--listen", up}, nil)
	proctest.AwaitHTTP(t, "http://"+up+"/", readyTimeout, echo)
	for i := 0; i < 3; i++ {
		addr := proctest.FreeAddr(t)
		config := "envoy/envoy.yaml"
		if mtls {
			dir := filepath.Join(pki, "proxy-"+strconv.Itoa(i))
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			ca.Issue(t, testpki.Leaf{CommonName: "envoy", URIs: []string{"spiffe://sluice.test/ns/e2e/sa/proxy-" + strconv.Itoa(i)}}).Write(t, dir, "envoy")
			ca.WriteCA(t, dir, "ca")
			doc, err := os.ReadFile(filepath.Join(repo, "envoy", "envoy-mtls.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			config = filepath.Join(dir, "envoy.yaml")
			if err := os.WriteFile(config, bytes.ReplaceAll(doc, []byte("/etc/sluice/tls/"), []byte(dir+"/")), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		proxyEnv := append(tokens, "SLUICE_ENV=e2e")
		if mtls {
			// No token at all: the certificate names the proxy for its polls too.
			proxyEnv = []string{"SLUICE_ENV=e2e", "SLUICE_READ_TOKEN=", "SLUICE_QUOTA_TOKEN="}
		}
		dp := startProc(t, "dev proxy "+strconv.Itoa(i), filepath.Join(binDir, "sluice-devproxy"), []string{
			"--config", config, "--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", addr,
			"--upstream", up, "--cluster", "control_plane=" + s.cpAddrs[i%2], "--access-log", filepath.Join(t.TempDir(), "access.log"),
			"--workers", strconv.Itoa(workers), "--log-level", "warn"}, proxyEnv)
		proctest.AwaitListening(t, addr, listenTimeout, dp)
		s.proxies = append(s.proxies, addr)
	}
	return s
}

// metric returns the value of the sample line starting with name on control plane i.
func (s *fleetStack) metric(i int, name string) float64 {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.scheme+"://"+s.cpAddrs[i]+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := s.cp.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatalf("metric %s: %q", name, l)
			}
			return f
		}
	}
	return 0
}

// put publishes the policy and waits until every worker of every proxy
// enforces it (a probe of that user answered with the rule's limit header).
func (s *fleetStack) put(doc string, user, limit string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, s.scheme+"://"+s.cpAddrs[0]+"/v1/policies/default", strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.cp.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 201 {
		s.t.Fatalf("PUT policy: %d %s", resp.StatusCode, b)
	}
	for _, p := range s.proxies {
		run := 0
		if !proctest.WaitFor(30*time.Second, func() bool {
			for {
				st, h := s.get(p, "/e2e/probe", user)
				if st != 200 || h.Get("X-Ratelimit-Limit") != limit {
					run = 0
					return false
				}
				if run++; run >= 2*workers {
					return true
				}
			}
		}) {
			s.t.Fatalf("proxy %s never enforced the policy", p)
		}
	}
}

func (s *fleetStack) get(proxy, path, user string) (int, http.Header) {
	s.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+proxy+path, nil)
	req.Header.Set("X-User-Id", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("GET: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// fleetDoc is a policy whose rule "fleet-user" limits /e2e/ per user across
// the fleet with the algorithm members alg; allowed responses carry
// X-RateLimit-*, which is how put sees that a proxy enforces it.
func fleetDoc(alg string) string {
	return `{"policy":"default","identity":{"user_header":"x-user-id"},"response_headers":{"set":"x-ratelimit","on_allow":true},"rules":[` +
		`{"id":"fleet-user","match":{"path_prefix":"/e2e/"},"key":["user"],` + alg + `,"scope":"fleet"}]}`
}

func TestFleetLimitAcrossProxies(t *testing.T) {
	s := startFleetStack(t)
	run := func(user string) (admitted int, took time.Duration) {
		start := time.Now()
		for i := 0; i < 1000; i++ {
			st, _ := s.get(s.proxies[i%3], "/e2e/items", user)
			switch st {
			case 200:
				admitted++
			case 429:
			default:
				t.Fatalf("request %d: status %d", i, st)
			}
		}
		return admitted, time.Since(start)
	}

	t.Run("fixed_window", func(t *testing.T) {
		s.t = t
		s.put(fleetDoc(`"algorithm":"fixed_window","limit":300,"window":"1h"`), "probe-fw", "300")
		if n, _ := run("alice"); n != 300 {
			t.Fatalf("admitted %d of 1000 across three proxies, want exactly 300", n)
		}
		if st, _ := s.get(s.proxies[1], "/e2e/items", "bob"); st != 200 {
			t.Fatalf("another user: %d", st)
		}
	})
	t.Run("token_bucket", func(t *testing.T) {
		s.t = t
		s.put(fleetDoc(`"algorithm":"token_bucket","limit":300,"window":"1h"`), "probe-tb", "300")
		n, took := run("carol")
		// Σ admitted ≤ capacity + limit·t/window over the run.
		bound := 300 + int(300*took.Seconds()/3600) + 1
		if n > bound || n == 0 {
			t.Fatalf("admitted %d of 1000 in %v, want 1..%d", n, took, bound)
		}
		t.Logf("token_bucket: admitted %d of 1000 in %v (bound %d)", n, took, bound)
		if st, _ := s.get(s.proxies[2], "/e2e/items", "dave"); st != 200 {
			t.Fatalf("another user: %d", st)
		}
	})
}

// TestFleetLimitOverMTLS: the fleet of three proxies, each with a certificate of its
// own, spends one budget through two control planes that serve HTTPS and know each
// Envoy by its certificate (no quota token anywhere): exactly the limit is admitted.
// The proxies keep their connections alive: a handful of handshakes serve every
// quota call and long poll.
func TestFleetLimitOverMTLS(t *testing.T) {
	s := startFleetStackWith(t, true)
	s.put(fleetDoc(`"algorithm":"fixed_window","limit":300,"window":"1h"`), "probe-mtls", "300")
	admitted := 0
	for i := 0; i < 1000; i++ {
		switch st, _ := s.get(s.proxies[i%3], "/e2e/items", "erin"); st {
		case 200:
			admitted++
		case 429:
		default:
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	if admitted != 300 {
		t.Fatalf("admitted %d of 1000 across three proxies over mTLS, want exactly 300", admitted)
	}
	var calls, handshakes float64
	for i := range s.cpAddrs {
		calls += s.metric(i, `sluice_controlplane_quota_request_duration_seconds_count{code="200"}`)
		handshakes += s.metric(i, "sluice_controlplane_tls_handshakes_total")
	}
	t.Logf("%.0f quota calls answered 200, %.0f TLS handshakes in all", calls, handshakes)
	if calls == 0 {
		t.Fatal("no quota call was answered 200")
	}
	if handshakes >= calls {
		t.Fatalf("%.0f handshakes for %.0f quota calls: connections are not kept alive", handshakes, calls)
	}
}
