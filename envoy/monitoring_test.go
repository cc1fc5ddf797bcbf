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

	"github.com/sluice-proxy/sluice/envoy/monitoring"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// monitoringExprs returns every PromQL expression of the Grafana dashboard and
// the Prometheus rules, checking that each rule has a severity and a summary.
func monitoringExprs(t *testing.T) []string {
	t.Helper()
	dash, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("monitoring/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	exprs, alerts, err := monitoring.Expressions(dash, rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range alerts {
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("prometheus-rules.yaml: %s needs a severity label and a summary", r.Alert)
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("%d expressions in the monitoring files", len(exprs))
	}
	return exprs
}

// filterMetricRef matches the filter's metrics in PromQL: the name Envoy's
// /stats/prometheus gives them, sluice_<rest> (no envoy_ prefix for a custom
// stat), with envoy_ or envoy_wasmcustom_ optional; <rest> possibly a regular
// expression.
var filterMetricRef = regexp.MustCompile(`\(\?:envoy_\(\?:wasmcustom_\)\?\)\?sluice_([a-z0-9_.+()]+)`)

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
		if m, ok := h.Metric("sluice.policy_sync.successes"); ok && m.Value > 0 {
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
	refs := 0
	defer func() {
		if refs < 10 {
			t.Errorf("only %d filter metrics named in the monitoring files: is filterMetricRef out of date?", refs)
		}
	}()
	for _, e := range monitoringExprs(t) {
		for _, m := range filterMetricRef.FindAllStringSubmatch(e, -1) {
			refs++
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
