package synctest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Built once per test binary by TestMain.
var (
	wasmBin []byte // build/sluice.wasm, built into a temporary directory
	cpBin   string // the sluice-controlplane binary
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "synctest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wasmPath := filepath.Join(dir, "sluice.wasm")
	cpBin = filepath.Join(dir, "sluice-controlplane")
	builds := []struct {
		env  []string
		args []string
	}{
		{[]string{"GOOS=wasip1", "GOARCH=wasm"}, []string{"build", "-buildmode=c-shared", "-o", wasmPath, "./filter"}},
		{nil, []string{"build", "-o", cpBin, "./controlplane/cmd/sluice-controlplane"}},
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("go", b.args...)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), b.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go %s: %v\n%s", strings.Join(b.args, " "), err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if wasmBin, err = os.ReadFile(wasmPath); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// waitFor polls cond every 10 ms until it holds or limit passes; it
// reports whether it held. Only bounds, never timings, are asserted with it.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is an io.Writer safe for a process's stdout and stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRedis runs redis-server on a free loopback port without persistence
// and returns its address; it is killed when the test ends.
func startRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not found on PATH: install Debian's redis-server package (CI does)")
	}
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	out := &syncBuffer{}
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ok := waitFor(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		io.WriteString(c, "PING\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return strings.HasPrefix(line, "+PONG")
	})
	if !ok {
		t.Fatalf("redis-server on %s did not answer PING within 10s:\n%s", addr, out)
	}
	return addr
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
	args []string
	cmd  *exec.Cmd
	out  *syncBuffer
}

// startControlPlane runs the control plane against the Redis at redisAddr,
// or, if redisAddr is "", its embedded store in a temporary directory.
func startControlPlane(t testing.TB, redisAddr string) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, addr: freeAddr(t), out: &syncBuffer{}}
	c.args = []string{"--listen", c.addr, "--log-level", "warn", "--resync-interval", "200ms"}
	if redisAddr != "" {
		c.args = append(c.args, "--redis-url", "redis://"+redisAddr)
	} else {
		c.args = append(c.args, "--data-dir", t.TempDir())
	}
	c.start()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			t.Logf("control plane output:\n%s", c.out)
		}
	})
	return c
}

func (c *controlPlane) start() {
	c.t.Helper()
	c.cmd = exec.Command(cpBin, c.args...)
	c.cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+adminToken, "SLUICE_READ_TOKEN="+readToken)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		c.t.Fatalf("starting the control plane: %v", err)
	}
	ok := waitFor(15*time.Second, func() bool {
		resp, err := http.Get("http://" + c.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ok {
		c.t.Fatalf("control plane on %s not ready within 15s:\n%s", c.addr, c.out)
	}
}

// stop kills the process (no graceful shutdown: an outage).
func (c *controlPlane) stop() {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	c.cmd = nil
}

// put stores doc as the policy with PUT and returns the new version.
func (c *controlPlane) put(doc string) uint64 {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+c.addr+"/v1/policies/"+policyName, strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("PUT policy: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		c.t.Fatalf("PUT policy: %s: %s", resp.Status, body)
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.Trim(resp.Header.Get("ETag"), `"`), "v"), 10, 64)
	if err != nil {
		c.t.Fatalf("PUT policy: ETag %q: %v", resp.Header.Get("ETag"), err)
	}
	return v
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
		// As Envoy's router answers a connect failure (fact sheet §4).
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
