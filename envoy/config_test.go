package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	extv1alpha1 "istio.io/api/extensions/v1alpha1"
	networkingv1 "istio.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// wasmBin is the filter, built once by TestMain as `make wasm` builds it.
var wasmBin []byte

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "envoy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := filepath.Join(dir, "sluice.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./filter")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the filter: %v\n%s", err, b)
		os.Exit(1)
	}
	if wasmBin, err = os.ReadFile(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// seedFields are the access-log fields of the seeds (issue 7).
var seedFields = []string{"timestamp", "env", "trace_id", "request_id", "user_id", "tenant_id", "method", "path",
	"query", "status_code", "response_time_ms", "client_ip", "user_agent", "rate_limited",
	"rate_limit_rule", "rate_limit_key", "rate_limit_limit", "rate_limit_remaining", "rate_limit_reset",
	"rate_limit_shadow", "rate_limit_policy_version", "rate_limit_reason"}

func TestEnvoyBootstrap(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := devproxy.ParseEnvoyConfig(doc)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	if c.Filter == nil {
		t.Fatal("envoy.yaml: no envoy.filters.http.wasm filter")
	}
	if c.Filter.VMID == "" || !c.Filter.FailOpen || c.Filter.WasmFile != "build/sluice.wasm" {
		t.Errorf("wasm filter: vm_id %q, fail open %t, file %q", c.Filter.VMID, c.Filter.FailOpen, c.Filter.WasmFile)
	}
	if c.AccessLog == nil {
		t.Fatal("envoy.yaml: no JSON access log")
	}
	var got []string
	for k := range c.AccessLog.JSONFormat.GetFields() {
		got = append(got, k)
	}
	for _, f := range seedFields {
		if !slices.Contains(got, f) {
			t.Errorf("access log: field %q missing", f)
		}
	}
	var pc struct {
		ControlPlane struct{ Cluster, Policy string } `json:"control_plane"`
	}
	if err := json.Unmarshal(c.Filter.PluginConfig, &pc); err != nil {
		t.Fatalf("plugin configuration: %v", err)
	}
	if _, ok := c.Clusters[pc.ControlPlane.Cluster]; !ok {
		t.Errorf("plugin configuration: control_plane.cluster %q is not a cluster of the file", pc.ControlPlane.Cluster)
	}
	if pc.ControlPlane.Policy != "default" {
		t.Errorf("plugin configuration: policy %q, want default (the demo policy's name)", pc.ControlPlane.Policy)
	}
	startFilter(t, c.Filter.PluginConfig, c.Filter.VMConfig)
}

// TestEnvoyBootstrapTypos checks that the parse is strict: a misspelt
// field, an unknown enum value and a value Envoy's validation refuses each
// fail.
func TestEnvoyBootstrapTypos(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, from, to string }{
		{"misspelt field", "vm_id: sluice", "vmid: sluice"},
		{"unknown enum", "failure_policy: FAIL_OPEN", "failure_policy: FAIL_OPENED"},
		{"invalid value", "port_value: 10000", "port_value: 70000"},
		{"invalid value inside a typed config", "stat_prefix: ingress_http", "stat_prefix: \"\""},
		{"unknown typed config", "envoy.extensions.filters.http.router.v3.Router", "envoy.extensions.filters.http.router.v3.Routr"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := bytes.Replace(doc, []byte(c.from), []byte(c.to), 1)
			if bytes.Equal(bad, doc) {
				t.Fatalf("%q not in envoy.yaml", c.from)
			}
			if _, err := devproxy.ParseBootstrap(bad); err == nil {
				t.Fatalf("accepted with %q", c.to)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
}

func TestIstio(t *testing.T) {
	files, err := filepath.Glob("istio/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no istio/*.yaml (%v)", err)
	}
	kinds := map[string]int{}
	for _, f := range files {
		doc, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, part := range strings.Split(string(doc), "\n---\n") {
			kind, spec := parseResource(t, fmt.Sprintf("%s[%d]", f, i), []byte(part))
			kinds[kind]++
			if wp, ok := spec.(*extv1alpha1.WasmPlugin); ok {
				if wp.GetFailStrategy() != extv1alpha1.FailStrategy_FAIL_OPEN || wp.GetPhase() != extv1alpha1.PluginPhase_AUTHN {
					t.Errorf("%s: failStrategy %v, phase %v", f, wp.GetFailStrategy(), wp.GetPhase())
				}
				// Istio hands pluginConfig to the filter as JSON.
				cfg, err := protojson.Marshal(wp.GetPluginConfig())
				if err != nil {
					t.Fatal(err)
				}
				startFilter(t, cfg, nil)
			}
		}
	}
	for _, k := range []string{"WasmPlugin", "ServiceEntry", "DestinationRule"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s resources, want 1", kinds[k], k)
		}
	}
	// Strictness: a misspelt spec field is refused.
	_, err = decodeSpec("WasmPlugin", []byte(`{"failStrategy":"FAIL_OPEN","pluginConfg":{}}`))
	if err == nil {
		t.Error("a misspelt WasmPlugin field was accepted")
	}
}

// parseResource decodes one Kubernetes resource and its spec with Istio's
// API types.
func parseResource(t *testing.T, name string, doc []byte) (string, proto.Message) {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var r struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
		Spec       json.RawMessage `json:"spec"`
	}
	d := json.NewDecoder(bytes.NewReader(js))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want := map[string]string{"WasmPlugin": "extensions.istio.io/v1alpha1",
		"ServiceEntry": "networking.istio.io/v1", "DestinationRule": "networking.istio.io/v1"}[r.Kind]
	if want == "" || r.APIVersion != want {
		t.Fatalf("%s: kind %q apiVersion %q (want one of WasmPlugin, ServiceEntry, DestinationRule with its apiVersion)", name, r.Kind, r.APIVersion)
	}
	spec, err := decodeSpec(r.Kind, r.Spec)
	if err != nil {
		t.Fatalf("%s: spec: %v", name, err)
	}
	return r.Kind, spec
}

func decodeSpec(kind string, js []byte) (proto.Message, error) {
	var m proto.Message
	switch kind {
	case "WasmPlugin":
		m = &extv1alpha1.WasmPlugin{}
	case "ServiceEntry":
		m = &networkingv1.ServiceEntry{}
	case "DestinationRule":
		m = &networkingv1.DestinationRule{}
	}
	return m, protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(js, m)
}

// startFilter loads the real filter with a plugin configuration, as Envoy
// does at configuration time (canary VM, then a worker): on_configure
// must succeed.
func startFilter(t *testing.T, pluginConfig, vmConfig []byte) {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{Wasm: wasmBin, VMID: "sluice", PluginName: "sluice",
		RootID: "sluice", PluginConfig: pluginConfig, VMConfig: vmConfig, Workers: 1,
		Clusters: map[string]string{"control_plane": "127.0.0.1:1"}, LogLevel: host.LogWarn})
	if err != nil {
		var logs []string
		if h != nil {
			for _, l := range h.Logs() {
				logs = append(logs, l.Message)
			}
		}
		t.Fatalf("the filter refused the configuration %s: %v %v", pluginConfig, err, logs)
	}
	h.Close()
}

// TestAccessLogTraceIDMatchesReply runs envoy.yaml's access log and the
// real filter in the dev proxy, with a static one-request policy in place
// of the control plane: a request that carries only x-request-id and gets
// a 429 shows the same trace id in the reply body and in the access log;
// a request with a traceparent and an x-request-id too; an allowed request
// has no trace_id (there is no body to agree with) and its traceparent is
// logged as is.
func TestAccessLogTraceIDMatchesReply(t *testing.T) {
	c, err := devproxy.LoadEnvoyConfig("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.Filter.PluginConfig = []byte(`{"env":"t","policy":{"policy":"p","rules":[
	  {"id":"one","algorithm":"fixed_window","limit":1,"window":"1h"}]}}`)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	var log syncLines
	p, err := devproxy.New(context.Background(), devproxy.Options{Config: c, Wasm: wasmBin, Workers: 1,
		Upstream: up.Listener.Addr().String(), AccessLog: &log, LogLevel: host.LogWarn})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	srv := httptest.NewServer(p)
	defer srv.Close()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, tc := range []struct {
		headers  map[string]string
		status   int
		traceID  any // the log's trace_id; for a 429 also the body's
		loggedTP any
	}{
		{map[string]string{"X-Request-Id": "r-1", "Traceparent": tp}, 200, nil, tp},
		{map[string]string{"X-Request-Id": "r-2"}, 429, "r-2", nil},
		{map[string]string{"X-Request-Id": "r-3", "Traceparent": tp}, 429, "r-3", tp},
	} {
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("request %d: status %d, want %d", i+1, resp.StatusCode, tc.status)
		}
		lines := log.get()
		if len(lines) != i+1 {
			t.Fatalf("request %d: %d log lines", i+1, len(lines))
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &e); err != nil {
			t.Fatal(err)
		}
		if e["trace_id"] != tc.traceID || e["traceparent"] != tc.loggedTP {
			t.Errorf("request %d: log trace_id %#v traceparent %#v, want %#v %#v", i+1, e["trace_id"], e["traceparent"], tc.traceID, tc.loggedTP)
		}
		if tc.status == 429 {
			var b struct {
				TraceID string `json:"trace_id"`
			}
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatalf("request %d: body %s: %v", i+1, body, err)
			}
			if b.TraceID != tc.traceID {
				t.Errorf("request %d: body trace_id %q, log trace_id %#v", i+1, b.TraceID, e["trace_id"])
			}
		}
	}
}

// syncLines collects access-log lines written from the proxy's goroutines.
type syncLines struct {
	mu    sync.Mutex
	lines []string
}

func (s *syncLines) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		s.lines = append(s.lines, l)
	}
	return len(b), nil
}

func (s *syncLines) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}
