package fleetquota

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// Built once per test binary by TestMain.
var (
	wasmBin []byte
	cpBin   string
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(floorListenEnv); addr != "" {
		serveFloor(addr) // this process is a child of BenchmarkQuotaThousandsOfEnvoys
		return
	}
	proctest.MainWithFilterAndControlPlane(m, func(wasm []byte, cp string) { wasmBin, cpBin = wasm, cp })
}

const (
	adminToken = "admin-secret"
	readToken  = "read-secret"
	quotaToken = "quota-secret"
	policyName = "default"
)

// controlPlane is a sluice-controlplane process.
type controlPlane struct {
	t    testing.TB
	addr string
	p    *proctest.Proc
}

// startControlPlane runs the control plane on the Redis at redisAddr, or on
// its embedded store when redisAddr is "".
func startControlPlane(t testing.TB, redisAddr string) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, addr: proctest.FreeAddr(t)}
	args := []string{"--listen", c.addr, "--log-level", "warn", "--resync-interval", "200ms"}
	if redisAddr != "" {
		args = append(args, "--redis-url", "redis://"+redisAddr)
	} else {
		args = append(args, "--data-dir", t.TempDir())
	}
	c.p = proctest.Start(t, proctest.Spec{Name: "control plane", Bin: cpBin, Args: args,
		Env: []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}})
	proctest.AwaitHTTP(t, "http://"+c.addr+"/readyz", 15*time.Second, c.p)
	return c
}

// put stores doc as the policy and returns its version.
func (c *controlPlane) put(doc string) uint64 {
	c.t.Helper()
	return proctest.PutPolicy(c.t, c.addr, policyName, adminToken, doc)
}

// quotaProxy stands between the filter and the control plane: it counts the
// quota calls and their keys, can hold them until released, and can answer
// them itself (a fault) instead of forwarding.
type quotaProxy struct {
	srv *httptest.Server

	mu     sync.Mutex
	calls  int
	keys   int
	bodies []string
	// answers counts the control plane's answers passed on, granting those
	// that granted any unit.
	answers, granting int
	gate              chan struct{} // non-nil: quota calls wait until it is closed
	fault             func(w http.ResponseWriter) bool
	answer            func(req *quota.Request) *quota.Response // non-nil: answers every quota call
}

func newQuotaProxy(t testing.TB, target string) *quotaProxy {
	t.Helper()
	q := &quotaProxy{}
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/v1/quota" || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		granted := false
		if r, err := quota.DecodeResponse(body); err == nil {
			for _, k := range r.Keys {
				granted = granted || k.Granted > 0
			}
		}
		q.mu.Lock()
		q.answers++
		if granted {
			q.granting++
		}
		q.mu.Unlock()
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
	}
	q.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/quota" {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			q.mu.Lock()
			q.calls++
			q.keys += strings.Count(string(body), `"key":`)
			q.bodies = append(q.bodies, string(body))
			gate, fault, answer := q.gate, q.fault, q.answer
			q.mu.Unlock()
			if answer != nil {
				req, err := quota.DecodeRequest(body, quota.Limits{})
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write(quota.AppendResponse(nil, answer(req)))
				return
			}
			if gate != nil {
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
			}
			if fault != nil && fault(w) {
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(q.srv.Close)
	return q
}

func (q *quotaProxy) addr() string { return q.srv.Listener.Addr().String() }

// answered returns how many answers the control plane gave through the
// proxy, and how many of them granted units.
func (q *quotaProxy) answered() (answers, granting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.answers, q.granting
}

// envoys returns the distinct "envoy" ids of the quota calls seen so far.
func (q *quotaProxy) envoys() map[string]bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ids := map[string]bool{}
	for _, b := range q.bodies {
		var r struct {
			Envoy string `json:"envoy"`
		}
		if json.Unmarshal([]byte(b), &r) == nil {
			ids[r.Envoy] = true
		}
	}
	return ids
}

// count returns the quota calls seen so far.
func (q *quotaProxy) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.calls
}

// hold makes quota calls wait until the returned function is called.
func (q *quotaProxy) hold() (release func()) {
	gate := make(chan struct{})
	q.mu.Lock()
	q.gate = gate
	q.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			q.gate = nil
			q.mu.Unlock()
			close(gate)
		})
	}
}

// setAnswer makes the proxy answer every quota call itself, with f's response.
func (q *quotaProxy) setAnswer(f func(req *quota.Request) *quota.Response) {
	q.mu.Lock()
	q.answer = f
	q.mu.Unlock()
}

// setFault makes the proxy answer quota calls with f (when it returns true).
func (q *quotaProxy) setFault(f func(w http.ResponseWriter) bool) {
	q.mu.Lock()
	q.fault = f
	q.mu.Unlock()
}

// envoy is one Envoy: the real sluice.wasm under the testenv host.
type envoy struct {
	t testing.TB
	h *host.Host
}

// pluginConfig is the filter configuration: rule sync and quota through the
// cluster "control_plane"; extra more control_plane members.
func pluginConfig(extra string) string {
	return `{"control_plane":{"cluster":"control_plane","authority":"cp.test","policy":"` + policyName +
		`","token":"` + readToken + `","quota_token":"` + quotaToken + `","wait":"2s","timeout":"7s","lease":"1s"` + extra +
		`},"tick":"50ms"}`
}

// startEnvoy runs an Envoy of workers VMs whose control_plane cluster is
// cpAddr, with the control_plane members extra, and waits until every
// worker enforces policy version want.
func startEnvoy(t testing.TB, cpAddr string, workers int, extra string, want uint64) *envoy {
	t.Helper()
	return startEnvoyNode(t, cpAddr, workers, extra, want, "")
}

// startEnvoyNode is startEnvoy for an Envoy whose bootstrap node.id is nodeID
// ("" for none).
func startEnvoyNode(t testing.TB, cpAddr string, workers int, extra string, want uint64, nodeID string) *envoy {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{
		Wasm: wasmBin, VMID: "sluice", PluginName: "sluice", NodeID: nodeID,
		PluginConfig: []byte(pluginConfig(extra)),
		Workers:      workers, Clock: host.SystemClock,
		Clusters: map[string]string{"control_plane": cpAddr},
		LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	e := &envoy{t: t, h: h}
	t.Cleanup(func() {
		for _, l := range h.Logs() {
			if l.Level >= host.LogError {
				t.Errorf("guest error log (worker %d): %.2000s", l.Worker, l.Message)
			}
		}
		if t.Failed() {
			for _, l := range h.Logs() {
				t.Logf("worker %d: %s: %s", l.Worker, l.Level, l.Message)
			}
		}
		h.Close()
	})
	for w := 0; w < workers; w++ {
		e.awaitVersion(w, want)
	}
	return e
}

// awaitVersion waits until worker w enforces policy version v: probe
// requests make it check for a newer version, and its log says when it
// took one up (proctest.WorkerVersions).
func (e *envoy) awaitVersion(w int, v uint64) {
	e.t.Helper()
	ok := proctest.WaitFor(20*time.Second, func() bool {
		_, err := e.h.Worker(w).Do(context.Background(), host.Request{Path: "/probe"})
		return err == nil && proctest.WorkerVersions(e.h.Logs(), "default")[w] == v
	})
	if !ok {
		e.t.Fatalf("worker %d never enforced policy version %d", w, v)
	}
}

// do sends one request for user on worker w.
func (e *envoy) do(w int, user string) host.Response {
	e.t.Helper()
	resp, err := e.h.Worker(w).Do(context.Background(), host.Request{Path: "/api", Headers: host.Headers{{"x-user", user}}})
	if err != nil {
		e.t.Fatalf("Do: %v", err)
	}
	return resp
}

// metric waits until the metric (flushed on each tick) reaches at least
// min and returns its value then (its value after the wait if it never
// does).
func (e *envoy) metric(name string, min int64) int64 {
	var v int64
	proctest.WaitFor(5*time.Second, func() bool {
		m, _ := e.h.Metric(name)
		v = m.Value
		return v >= min
	})
	return v
}

// fleetPolicy is a policy with one rule on /api keyed by user; rule holds
// the algorithm members and scope.
func fleetPolicy(rule string) string {
	return `{"policy":"` + policyName + `","identity":{"user_header":"x-user"},"rules":[` +
		`{"id":"per-user","match":{"path_prefix":"/api"},"key":["user"],` + rule + `}]}`
}
