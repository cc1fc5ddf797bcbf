package app

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestMonitoringUsesTheControlPlanesMetrics: every control-plane metric the
// Grafana dashboard and the Prometheus rules (envoy/monitoring) name is in the
// registry the binary serves on /metrics.
func TestMonitoringUsesTheControlPlanesMetrics(t *testing.T) {
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_QUOTA_TOKEN": "qt", "SLUICE_DATA_DIR": t.TempDir()}
	gaddr := freeAddr(t)
	c, _ := server(t, []string{"--resync-interval", "50ms", "--grpc-listen", gaddr}, env)
	// Traffic, so that the labelled series exist: a write, a read, a quota call.
	if r := c.Do("PUT", "/v1/policies/p", []byte(fleetDoc)); r.Status != 201 {
		t.Fatalf("PUT → %d", r.Status)
	}
	c.Do("GET", "/v1/policies/p", nil)
	c.Do("POST", "/v1/quota", []byte(`{"envoy":"e1","policy":"p","version":1,"keys":[{"rule":"fw","key":"rl:default:p/fw:*:3600s","want":1}]}`), "Authorization", "Bearer qt")
	rlqsExchange(t, gaddr, "qt")
	served := map[string]bool{}
	for _, line := range strings.Split(string(c.Do("GET", "/metrics", nil).Body), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			served[f[2]] = true
		}
	}
	ref := regexp.MustCompile(`sluice_controlplane_[a-z_]+`)
	n := 0
	for _, file := range []string{"../../../envoy/monitoring/grafana-dashboard.json", "../../../envoy/monitoring/prometheus-rules.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range ref.FindAllString(string(b), -1) {
			n++
			base := name
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if s := strings.TrimSuffix(name, suffix); s != name && served[s] {
					base = s
				}
			}
			if !served[base] {
				t.Errorf("%s names %s, which the control plane does not serve", file, name)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d control-plane metric references found", n)
	}
}
