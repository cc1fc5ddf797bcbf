package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
)

const quotaToken = "e2e-quota-token"

// fleetStack is two control-plane replicas on one redis-server and three
// dev proxies (2 workers each), each proxy's control_plane cluster on one
// replica.
type fleetStack struct {
	t       *testing.T
	cpAddrs []string
	proxies []string
}

func startFleetStack(t *testing.T) *fleetStack {
	t.Helper()
	s := &fleetStack{t: t}
	redisAddr := proctest.FreeAddr(t)
	startRedis(t, redisAddr, t.TempDir())
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	for i := 0; i < 2; i++ {
		addr := proctest.FreeAddr(t)
		p := startProc(t, "control plane "+strconv.Itoa(i), filepath.Join(binDir, "sluice-controlplane"),
			[]string{"--listen", addr, "--log-level", "warn", "--resync-interval", "200ms", "--redis-url", "redis://" + redisAddr}, tokens)
		proctest.AwaitHTTP(t, "http://"+addr+"/readyz", readyTimeout, p)
		s.cpAddrs = append(s.cpAddrs, addr)
	}
	up := proctest.FreeAddr(t)
	echo := startProc(t, "upstream", filepath.Join(binDir, "sluice-echo"), []string{"--listen", up}, nil)
	proctest.AwaitHTTP(t, "http://"+up+"/", readyTimeout, echo)
	for i := 0; i < 3; i++ {
		addr := proctest.FreeAddr(t)
		dp := startProc(t, "dev proxy "+strconv.Itoa(i), filepath.Join(binDir, "sluice-devproxy"), []string{
			"--config", "envoy/envoy.yaml", "--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", addr,
			"--upstream", up, "--cluster", "control_plane=" + s.cpAddrs[i%2], "--access-log", filepath.Join(t.TempDir(), "access.log"),
			"--workers", strconv.Itoa(workers), "--log-level", "warn"}, append(tokens, "SLUICE_ENV=e2e"))
		proctest.AwaitListening(t, addr, listenTimeout, dp)
		s.proxies = append(s.proxies, addr)
	}
	return s
}

// put publishes the policy and waits until every worker of every proxy
// enforces it (a probe of that user answered with the rule's limit header).
func (s *fleetStack) put(doc string, user, limit string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+s.cpAddrs[0]+"/v1/policies/default", strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
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
// the fleet with the algorithm members alg.
func fleetDoc(alg string) string {
	return `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
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
