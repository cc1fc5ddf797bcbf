package envoy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// monitoringExprs returns every PromQL expression of the Grafana dashboard and
// the Prometheus rules.
func monitoringExprs(t *testing.T) []string {
	t.Helper()
	var exprs []string
	b, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	b, err = os.ReadFile("monitoring/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	if err := yaml.UnmarshalStrict(b, &rules); err != nil {
		t.Fatalf("prometheus-rules.yaml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Fatalf("prometheus-rules.yaml: a rule without alert or expr: %+v", r)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("prometheus-rules.yaml: %s needs a severity label and a summary", r.Alert)
			}
			exprs = append(exprs, r.Expr)
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("%d expressions in the monitoring files", len(exprs))
	}
	return exprs
}

// filterMetricRef matches the filter's metrics in PromQL: Envoy's Prometheus name
// envoy_[wasmcustom_]sluice_<rest>, <rest> possibly a regular expression.
var filterMetricRef = regexp.MustCompile(`envoy_\(wasmcustom_\)\?sluice_([a-z0-9_.+()]+)`)

// TestMonitoringUsesTheFiltersMetrics: every filter metric the dashboard and the
// alert rules name is one the real filter defines, under Envoy's Prometheus name
// (non-alphanumerics as "_"): the filter runs the demo policy and pulls it once
// from a stand-in control plane that fails its first poll, so that the per-rule,
// quota and sync metrics all exist.
func TestMonitoringUsesTheFiltersMetrics(t *testing.T) {
	demo, err := os.ReadFile("../examples/default-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	var polls atomic.Int32
	cp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if polls.Add(1) == 1 {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var doc map[string]any
		_ = json.Unmarshal(demo, &doc)
		doc["version"] = 1
		b, _ := json.Marshal(doc)
		w.Header().Set("ETag", `"v1.e.s"`)
		w.Write(b)
	}))
	defer cp.Close()
	cfg := `{"policy":` + string(demo) + `,"control_plane":{"cluster":"control_plane","policy":"default","token":"t"}}`
	h, err := host.New(context.Background(), host.Config{Wasm: wasmBin, VMID: "sluice", PluginName: "sluice", RootID: "sluice",
		PluginConfig: []byte(cfg), Workers: 1, NoCanary: true, LogLevel: host.LogWarn,
		Clusters: map[string]string{"control_plane": strings.TrimPrefix(cp.URL, "http://")}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, ok := h.Metric("sluice.policy_sync.successes"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the filter never synced with the stand-in control plane; metrics: %v", h.MetricNames())
		}
		time.Sleep(20 * time.Millisecond) // polling the host for an event (the sync), not a fixed wait
	}
	var defined []string
	for _, n := range h.MetricNames() {
		defined = append(defined, regexp.MustCompile(`[^a-zA-Z0-9]`).ReplaceAllString(n, "_"))
	}
	defer func() {
		if t.Failed() {
			t.Logf("the filter defines %v", defined)
		}
	}()
	for _, e := range monitoringExprs(t) {
		for _, m := range filterMetricRef.FindAllStringSubmatch(e, -1) {
			re := regexp.MustCompile("^sluice_" + m[1] + "$")
			found := false
			for _, d := range defined {
				found = found || re.MatchString(d)
			}
			if !found {
				t.Errorf("%q names envoy_sluice_%s, which the filter does not define", e, m[1])
			}
		}
	}
}
