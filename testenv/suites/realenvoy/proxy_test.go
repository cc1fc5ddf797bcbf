package realenvoy

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// The two proxies a scenario runs through.
const (
	envoyKind    = "envoy"    // the real Envoy (build/envoy or $ENVOY)
	devProxyKind = "devproxy" // the dev proxy on the wazero host
)

var kinds = []string{envoyKind, devProxyKind}

// proxySpec says how to run one proxy: a bootstrap of envoy/ and what the
// test rewrites in it.
type proxySpec struct {
	name     string
	config   string            // e.g. "envoy/envoy.yaml"
	upstream string            // the "upstream" cluster's address
	clusters map[string]string // other clusters: name → address
	files    map[string]string // filenames to replace; build/sluice.wasm always becomes the suite's build
	workers  int               // 0: 2
	env      []string          // more environment
}

// proxy is a running Envoy or dev proxy.
type proxy struct {
	kind      string
	name      string
	addr      string // the listener
	admin     string // the admin endpoint (/ready, /stats, /stats/prometheus)
	accessLog string
	proc      *proctest.Proc
}

// startProxy runs spec through kind. Both get the same rewritten bootstrap
// (envoyproc.RewriteBootstrap), the same environment and the same number of
// workers; the dev proxy follows the file as Envoy does.
func startProxy(t testing.TB, kind string, spec proxySpec) *proxy {
	t.Helper()
	if spec.workers == 0 {
		spec.workers = 2
	}
	p := &proxy{kind: kind, name: spec.name + " (" + kind + ")", addr: proctest.FreeAddr(t), admin: proctest.FreeAddr(t),
		accessLog: filepath.Join(t.TempDir(), "access.log")}
	rw := bootstrap.Rewrite{Listeners: []string{p.addr}, Admin: p.admin, AccessLog: p.accessLog,
		Clusters: map[string]string{"upstream": spec.upstream},
		Files:    map[string]string{}}
	for k, v := range spec.clusters {
		rw.Clusters[k] = v
	}
	for k, v := range spec.files {
		rw.Files[k] = v
	}
	if _, ok := rw.Files["build/sluice.wasm"]; !ok && spec.config != "envoy/envoy-rlqs.yaml" {
		rw.Files["build/sluice.wasm"] = filepath.Join(binDir, "sluice.wasm")
	}
	env := append(append([]string{}, tokens...), spec.env...)
	switch kind {
	case envoyKind:
		e := envoyproc.Start(t, envoyproc.Options{Name: p.name, Root: repo, Config: spec.config, Rewrite: rw, Workers: spec.workers, Env: env})
		p.proc = e.Proc
	case devProxyKind:
		src, err := os.ReadFile(filepath.Join(repo, spec.config))
		if err != nil {
			t.Fatal(err)
		}
		out, err := bootstrap.Apply(src, rw)
		if err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(t.TempDir(), filepath.Base(spec.config))
		if err := os.WriteFile(cfg, out, 0o600); err != nil {
			t.Fatal(err)
		}
		p.proc = startProc(t, p.name, "sluice-devproxy", []string{"--config", cfg, "--workers", strconv.Itoa(spec.workers), "--log-level", "warn"}, env)
		proctest.AwaitHTTP(t, "http://"+p.admin+"/ready", envoyproc.ReadyTimeout, p.proc)
	default:
		t.Fatalf("unknown proxy kind %q", kind)
	}
	return p
}

// response is what a client got.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request on a new connection, with the headers given as name,
// value pairs.
func (p *proxy) do(t testing.TB, method, path string, kv ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+p.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := fresh.Do(req)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", p.name, method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// logOf waits for the access-log line of the request with x-request-id id.
func (p *proxy) logOf(t testing.TB, id string) map[string]any {
	t.Helper()
	return envoyproc.AwaitLogLine(t, p.accessLog, "request_id", id, 10*time.Second)
}

// prometheus returns the admin endpoint's /stats/prometheus.
func (p *proxy) prometheus(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/stats/prometheus")
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
