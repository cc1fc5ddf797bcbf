package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// seedFields are the fields every access-log line carries (the README's
// "Access log" section).
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
