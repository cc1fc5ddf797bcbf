package rulesync

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// Built once per test binary by TestMain.
var (
	wasmBin []byte // build/sluice.wasm, built into a temporary directory
	cpBin   string // the sluice-controlplane binary
)

func TestMain(m *testing.M) {
	proctest.MainWithFilterAndControlPlane(m, func(wasm []byte, cp string) { wasmBin, cpBin = wasm, cp })
}

// startRedis runs redis-server on a free loopback port without persistence
// and returns its address; it is killed when the test ends. Without
// redis-server on PATH the test fails.
func startRedis(t testing.TB) string {
	t.Helper()
	return redisproc.Start(t).Addr()
}

const (
	adminToken = "admin-secret"
	readToken  = "read-secret"
	policyName = "default"
)

// controlPlane is a sluice-controlplane process on a fixed loopback address,
// so it can be stopped and started again where the filter expects it.
type controlPlane struct {
	t    testing.TB
	addr string
	p    *proctest.Proc
}

// cpReadyTimeout is how long the control plane may take to answer /readyz.
const cpReadyTimeout = 15 * time.Second

// startControlPlane runs the control plane against the Redis at redisAddr,
// or, if redisAddr is "", its embedded store in a temporary directory.
func startControlPlane(t testing.TB, redisAddr string, extra ...string) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, addr: proctest.FreeAddr(t)}
	args := append([]string{"--listen", c.addr, "--log-level", "warn", "--resync-interval", "200ms"}, extra...)
	if redisAddr != "" {
		args = append(args, "--redis-url", "redis://"+redisAddr)
	} else {
		args = append(args, "--data-dir", t.TempDir())
	}
	c.p = proctest.Start(t, proctest.Spec{Name: "control plane", Bin: cpBin, Args: args,
		Env: []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken}})
	proctest.AwaitHTTP(t, "http://"+c.addr+"/readyz", cpReadyTimeout, c.p)
	return c
}

// start starts the stopped control plane again and waits until it is ready.
func (c *controlPlane) start() {
	c.t.Helper()
	c.p.Start()
	proctest.AwaitHTTP(c.t, "http://"+c.addr+"/readyz", cpReadyTimeout, c.p)
}

// stop kills the process (no graceful shutdown: an outage).
func (c *controlPlane) stop() { c.p.Kill() }

// put stores doc as the policy with PUT and returns the new version.
func (c *controlPlane) put(doc string) uint64 {
	c.t.Helper()
	return proctest.PutPolicy(c.t, c.addr, policyName, adminToken, doc)
}

// pollProxy is a reverse proxy in front of the control plane that counts
// the filter's long polls (GET /v1/policies/...?wait=...): in total, and
// how many were open at once. It stands for the network between Envoy and
// the control plane.
type pollProxy struct {
	srv *httptest.Server

	mu      sync.Mutex
	total   int
	open    int
	maxOpen int
}

func newPollProxy(t testing.TB, target string) *pollProxy {
	t.Helper()
	p := &pollProxy{}
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		// As Envoy's router answers a connect failure (docs/ENVOY.md, HTTP calls).
		http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/policies/") && r.URL.Query().Has("wait") {
			p.mu.Lock()
			p.total++
			p.open++
			p.maxOpen = max(p.maxOpen, p.open)
			p.mu.Unlock()
			defer func() {
				p.mu.Lock()
				p.open--
				p.mu.Unlock()
			}()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *pollProxy) addr() string { return p.srv.Listener.Addr().String() }

// counts returns the polls seen so far, how many are open now and the most
// that were open at once.
func (p *pollProxy) counts() (total, open, maxOpen int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, p.open, p.maxOpen
}

// scriptServer stands in for the control plane and answers each long poll
// with the next scripted response; with none queued, it holds the poll
// until one is queued or the wait (capped at 2 s) ends, then answers 304.
type scriptServer struct {
	srv   *httptest.Server
	queue chan scripted
	polls chan *http.Request
}

type scripted struct {
	status int
	etag   string
	body   string
	// cut, if set, sends Content-Length for body+cut bytes and closes the
	// connection after body: a response truncated in transit.
	cut int
}

func newScriptServer(t testing.TB) *scriptServer {
	t.Helper()
	s := &scriptServer{queue: make(chan scripted, 16), polls: make(chan *http.Request, 64)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.polls <- r:
		default:
		}
		if r.Header.Get("Authorization") != "Bearer "+readToken {
			http.Error(w, "bad token", http.StatusForbidden)
			return
		}
		wait, _ := time.ParseDuration(r.URL.Query().Get("wait"))
		timer := time.NewTimer(min(wait, 2*time.Second))
		defer timer.Stop()
		select {
		case resp := <-s.queue:
			if resp.etag != "" {
				w.Header().Set("ETag", resp.etag)
			}
			if resp.cut > 0 {
				w.Header().Set("Content-Length", strconv.Itoa(len(resp.body)+resp.cut))
				w.WriteHeader(resp.status)
				io.WriteString(w, resp.body)
				if hj, ok := w.(http.Hijacker); ok {
					w.(http.Flusher).Flush()
					conn, _, err := hj.Hijack()
					if err == nil {
						conn.Close()
					}
				}
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(resp.status)
			io.WriteString(w, resp.body)
		case <-timer.C:
			w.WriteHeader(http.StatusNotModified)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return s
}

func (s *scriptServer) addr() string { return s.srv.Listener.Addr().String() }

// bounded returns a context for one test step.
func bounded(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
