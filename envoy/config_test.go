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
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	extv1alpha1 "istio.io/api/extensions/v1alpha1"
	networkingv1 "istio.io/api/networking/v1"
	securityv1beta1 "istio.io/api/security/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// wasmBin is the filter, built once by TestMain as `make wasm` builds it;
// sluicectl is the path of the CLI TestMain built.
var (
	wasmBin   []byte
	sluicectl string
)

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
	sluicectl = filepath.Join(dir, "sluicectl")
	cmd = exec.Command("go", "build", "-o", sluicectl, "./controlplane/cmd/sluicectl")
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building sluicectl: %v\n%s", err, b)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// seedFields are the fields every access-log line carries (the README's
// "Access log" section).
var seedFields = []string{"timestamp", "env", "traceparent", "request_id", "user_id", "tenant_id", "method", "path",
	"query", "status_code", "response_time_ms", "client_ip", "user_agent", "rate_limit", "response_code_details"}

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
		if f == "istio/tokens.yaml" || f == "istio/gateway-env.patch.yaml" {
			continue // Kubernetes resources: TestIstioTokensComeFromASecret
		}
		if f == "istio/ratelimit-image.patch.yaml" {
			continue // a Deployment patch: TestTheImagePatchesChangeOnlyTheRatelimitContainersImage
		}
		doc, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, part := range strings.Split(string(doc), "\n---\n") {
			if regexp.MustCompile(`(?m)^kind: ConfigMap$`).MatchString(part) {
				// The control plane's trust-xfcc, a Kubernetes resource:
				// TestTheIstioInstallGivesTheControlPlaneASidecarAndTrustsItsXFCC.
				decodeStrict(t, fmt.Sprintf("%s[%d]", f, i), []byte(part), &corev1.ConfigMap{})
				kinds["ConfigMap"]++
				continue
			}
			kind, spec := parseResource(t, fmt.Sprintf("%s[%d]", f, i), []byte(part))
			kinds[kind]++
			switch r := spec.(type) {
			case *networkingv1.DestinationRule:
				// The gateway's calls are Istio mTLS, so the control plane's sidecar
				// can name the caller in x-forwarded-client-cert.
				if r.GetTrafficPolicy().GetTls().GetMode() != networkingv1.ClientTLSSettings_ISTIO_MUTUAL {
					t.Errorf("%s: DestinationRule tls mode %v, want ISTIO_MUTUAL", f, r.GetTrafficPolicy().GetTls().GetMode())
				}
			case *securityv1beta1.PeerAuthentication:
				// ... and the sidecar is the only way in (--trust-xfcc is safe).
				if r.GetMtls().GetMode() != securityv1beta1.PeerAuthentication_MutualTLS_STRICT {
					t.Errorf("%s: PeerAuthentication mode %v, want STRICT", f, r.GetMtls().GetMode())
				}
			}
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
	for _, k := range []string{"WasmPlugin", "ServiceEntry", "DestinationRule", "PeerAuthentication"} {
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
		"ServiceEntry": "networking.istio.io/v1", "DestinationRule": "networking.istio.io/v1",
		"PeerAuthentication": "security.istio.io/v1"}[r.Kind]
	if want == "" || r.APIVersion != want {
		t.Fatalf("%s: kind %q apiVersion %q (want one of WasmPlugin, ServiceEntry, DestinationRule, PeerAuthentication with its apiVersion)", name, r.Kind, r.APIVersion)
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
	case "PeerAuthentication":
		m = &securityv1beta1.PeerAuthentication{} // security.istio.io/v1 serves this message (security/v1 aliases it)
	}
	return m, protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(js, m)
}

// startFilter loads the real filter with a plugin configuration, as Envoy
// does at configuration time (canary VM, then a worker): on_configure
// must succeed.
func startFilter(t *testing.T, pluginConfig, vmConfig []byte) {
	t.Helper()
	// The proxy's environment, as a Deployment fills it from the tokens' Secret.
	env := map[string]string{"SLUICE_READ_TOKEN": "read-token-from-a-secret", "SLUICE_QUOTA_TOKEN": "quota-token-from-a-secret"}
	h, err := host.New(context.Background(), host.Config{Wasm: wasmBin, VMID: "sluice", PluginName: "sluice",
		RootID: "sluice", PluginConfig: pluginConfig, VMConfig: vmConfig, Workers: 1, Env: env,
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

// uncommentBlock returns doc with the lines between "# BEGIN name" and
// "# END name" uncommented (the first "# " after the indentation removed),
// and fails if the markers are missing.
func uncommentBlock(t *testing.T, doc []byte, name string) []byte {
	t.Helper()
	lines := strings.Split(string(doc), "\n")
	begin, end := -1, -1
	for i, l := range lines {
		switch strings.TrimSpace(l) {
		case "# BEGIN " + name:
			begin = i
		case "# END " + name:
			end = i
		}
	}
	if begin < 0 || end < begin {
		t.Fatalf("no # BEGIN %s ... # END %s block", name, name)
	}
	for i := begin + 1; i < end; i++ {
		l := lines[i]
		j := len(l) - len(strings.TrimLeft(l, " "))
		if !strings.HasPrefix(l[j:], "# ") {
			t.Fatalf("line %d of the %s block is not commented: %q", i+1, name, l)
		}
		lines[i] = l[:j] + l[j+2:]
	}
	return []byte(strings.Join(lines, "\n"))
}

// TestTrustedIdentityBlock: the commented-out filters that make x-user-id
// and x-tenant-id trustworthy decode strictly into Envoy's types, pass
// Envoy's validation, and run before sluice in the right order: the
// client's headers dropped, then the JWT's claims copied into them.
func TestTrustedIdentityBlock(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := devproxy.ParseBootstrap(uncommentBlock(t, doc, "trusted-identity"))
	if err != nil {
		t.Fatalf("the trusted-identity block, uncommented: %v", err)
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	var names []string
	removed := map[string]bool{}
	claims := map[string]string{}
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		m, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch v := m.(type) {
		case *headermutationv3.HeaderMutation:
			for _, rm := range v.GetMutations().GetRequestMutations() {
				removed[rm.GetRemove()] = true
			}
		case *jwtv3.JwtAuthentication:
			for _, p := range v.GetProviders() {
				for _, c := range p.GetClaimToHeaders() {
					claims[c.GetHeaderName()] = c.GetClaimName()
				}
			}
			if len(v.GetRules()) == 0 || v.GetRules()[0].GetRequires() == nil {
				t.Error("jwt_authn: no rule requiring a token")
			}
		}
	}
	want := []string{"envoy.filters.http.header_mutation", "envoy.filters.http.jwt_authn", "envoy.filters.http.wasm", "envoy.filters.http.router"}
	if !slices.Equal(names, want) {
		t.Errorf("http filters %v, want %v", names, want)
	}
	for _, h := range []string{"x-user-id", "x-tenant-id"} {
		if !removed[h] || claims[h] == "" {
			t.Errorf("%s: removed %t, set from claim %q", h, removed[h], claims[h])
		}
	}
	// The dev proxy still loads the file (it lists the two filters as
	// ignored).
	if _, err := devproxy.ParseEnvoyConfig(uncommentBlock(t, doc, "trusted-identity")); err != nil {
		t.Errorf("dev proxy: %v", err)
	}
}

// TestLoadBalancerComment: the file says how to run behind one load
// balancer, and what it says (xff_num_trusted_hops: 1 next to
// use_remote_address) is valid; the plugin configuration has no
// X-Forwarded-For setting of its own.
func TestLoadBalancerComment(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const line = "# xff_num_trusted_hops: 1"
	if !bytes.Contains(doc, []byte(line)) {
		t.Fatalf("envoy.yaml lacks %q", line)
	}
	c, err := devproxy.ParseEnvoyConfig(bytes.Replace(doc, []byte(line), []byte(line[2:]), 1))
	if err != nil {
		t.Fatal(err)
	}
	if !c.UseRemoteAddress || c.XffNumTrustedHops != 1 {
		t.Errorf("use_remote_address %t, xff_num_trusted_hops %d", c.UseRemoteAddress, c.XffNumTrustedHops)
	}
	if bytes.Contains(c.Filter.PluginConfig, []byte("trusted_hops")) {
		t.Error("the plugin configuration still sets trusted_hops")
	}
	istio, err := os.ReadFile("istio/wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"numTrustedProxies: 1", `proxy.istio.io/config: '{"gatewayTopology":{"numTrustedProxies":1}}'`} {
		if !bytes.Contains(istio, []byte(s)) {
			t.Errorf("istio/wasmplugin.yaml lacks %q", s)
		}
	}
	for _, l := range strings.Split(string(istio), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "trusted_hops") {
			t.Errorf("istio/wasmplugin.yaml still sets trusted_hops: %q", l)
		}
	}
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
		// The trace id is in the filter's rate_limit value, with a local
		// reply only.
		rl, err := filterstate.FromLogLine(e)
		if err != nil {
			t.Fatalf("request %d: rate_limit %v: %v", i+1, e[filterstate.LogField], err)
		}
		var traceID any
		if id, ok := rl["trace_id"]; ok {
			traceID = id
		}
		if traceID != tc.traceID || e["traceparent"] != tc.loggedTP {
			t.Errorf("request %d: log trace_id %#v traceparent %#v, want %#v %#v", i+1, traceID, e["traceparent"], tc.traceID, tc.loggedTP)
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
	s.lines = append(s.lines, strings.Split(strings.TrimRight(string(b), "\n"), "\n")...)
	return len(b), nil
}

func (s *syncLines) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// TestEnvoyMTLSBootstrap: envoy-mtls.yaml is envoy.yaml with the control_plane
// cluster's TLS transport socket presenting the Envoy's certificate, verifying the
// control plane's, and a plugin configuration without any token (the certificate
// identifies the Envoy, for polls and quota calls); the filter takes that
// configuration.
func TestEnvoyMTLSBootstrap(t *testing.T) {
	plain, err := devproxy.LoadEnvoyConfig("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := devproxy.LoadEnvoyConfig("envoy-mtls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	u := c.ClusterTLS["control_plane"]
	if u == nil || u.Cert.Filename == "" || u.Key.Filename == "" || u.TrustedCA.Filename == "" || len(u.SANs) == 0 {
		t.Fatalf("control_plane cluster TLS: %+v", u)
	}
	if len(c.ClusterTLS) != 1 || len(plain.ClusterTLS) != 0 {
		t.Fatalf("TLS clusters: mtls %d, plain %d", len(c.ClusterTLS), len(plain.ClusterTLS))
	}
	var pc, ppc map[string]any
	if err := json.Unmarshal(c.Filter.PluginConfig, &pc); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(plain.Filter.PluginConfig, &ppc); err != nil {
		t.Fatal(err)
	}
	cp := pc["control_plane"].(map[string]any)
	for _, k := range []string{"token", "token_env", "quota_token", "quota_token_env"} {
		if _, ok := cp[k]; ok {
			t.Errorf("envoy-mtls.yaml: the plugin configuration still carries a token (%s): the certificate names the Envoy", k)
		}
	}
	delete(ppc["control_plane"].(map[string]any), "token_env")
	delete(ppc["control_plane"].(map[string]any), "quota_token_env")
	a, _ := json.Marshal(pc)
	b, _ := json.Marshal(ppc)
	if string(a) != string(b) || c.Filter.WasmFile != plain.Filter.WasmFile || c.Listen != plain.Listen {
		t.Errorf("envoy-mtls.yaml differs from envoy.yaml beyond the control plane's TLS:\n%s\n%s", a, b)
	}
	startFilter(t, c.Filter.PluginConfig, c.Filter.VMConfig)
}

// TestNoManifestLetsABodyResumeAPausedRequest: with the Wasm filter's
// allow_on_headers_stop_iteration set, Envoy would call a body callback on
// a request the filter paused at its headers, and the first chunk would
// resume it. The filter exports no body callback, so that chunk would be
// answered Continue and a request held for a decision would pass: no file
// here may set it.
func TestNoManifestLetsABodyResumeAPausedRequest(t *testing.T) {
	var files []string
	for _, pat := range []string{"*.yaml", "*/*.yaml", "*/*/*.yaml"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 5 {
		t.Fatalf("found only %d manifests: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"allow_on_headers_stop_iteration", "allowOnHeadersStopIteration"} {
			if bytes.Contains(b, []byte(name)) {
				t.Errorf("%s sets %s", f, name)
			}
		}
	}
}
