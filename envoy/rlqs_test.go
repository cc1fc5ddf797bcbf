package envoy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
)

// envoyConfig runs `sluicectl envoy-config rlqs -f file` with env and returns its
// standard output and error.
func envoyConfig(t *testing.T, file string, env ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(sluicectl, "envoy-config", "rlqs", "-f", file)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sluicectl envoy-config rlqs -f %s: %v\n%s", file, err, errb.String())
	}
	return out.String(), errb.String()
}

// TestEnvoyRLQSBootstrap: envoy-rlqs.yaml is what `sluicectl envoy-config rlqs`
// generates from examples/rlqs-policy.json (so it never drifts from the
// generator), and it decodes strictly into go-control-plane's Bootstrap and passes
// the validation of every message in it, typed_config included.
func TestEnvoyRLQSBootstrap(t *testing.T) {
	doc, err := os.ReadFile("envoy-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := envoyConfig(t, "../examples/rlqs-policy.json", "SLUICE_QUOTA_TOKEN=")
	if string(doc) != want {
		t.Fatal("envoy-rlqs.yaml differs from the generator's output; regenerate it:\n" +
			"  go run ./controlplane/cmd/sluicectl envoy-config rlqs -f examples/rlqs-policy.json > envoy/envoy-rlqs.yaml")
	}
	b, err := devproxy.ParseBootstrap(doc)
	if err != nil {
		t.Fatal(err)
	}
	hcm := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig()
	for _, want := range []string{"rate_limit_quota.v3.RateLimitQuotaFilterConfig", "x-user-id", "SourceIPInput", "x-plan"} {
		if !strings.Contains(string(hcm.GetValue()), want) && !strings.Contains(string(doc), want) {
			t.Errorf("the bootstrap has no %s", want)
		}
	}
	names := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		names[c.GetName()] = true
	}
	if !names["sluice_rlqs"] || !names["upstream"] {
		t.Errorf("clusters %v, want sluice_rlqs and upstream", names)
	}
}

// TestEnvoyConfigForEveryRuleKind: every fleet rule of every algorithm and match
// condition yields a configuration that validates; what cannot be expressed is a
// note naming the rule, never a configuration that would enforce something else.
func TestEnvoyConfigForEveryRuleKind(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k.json")
	if err := os.WriteFile(file, []byte(`{"policy":"k","identity":{"user_header":"x-user-id"},"rules":[
	 {"id":"path","match":{"path":"/a.b","methods":["GET","POST"]},"key":["method","path"],"algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
	 {"id":"hdr","match":{"headers":[{"name":"x-a","exact":"1"},{"name":"x-b","prefix":"p"},{"name":"x-c","absent":true}]},"key":["header:x-k","route"],"algorithm":"gcra","limit":10,"burst":20,"window":"1s","scope":"fleet"},
	 {"id":"alt","key":["user|client_ip"],"algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
	 {"id":"slots","algorithm":"time_wheel","limit":10,"window":"10s","slots":10,"scope":"fleet"},
	 {"id":"costly","algorithm":"fixed_window","limit":10,"window":"1m","cost":2,"scope":"fleet"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	doc, all := envoyConfig(t, file, "SLUICE_QUOTA_TOKEN=qt")
	if _, err := devproxy.ParseBootstrap([]byte(doc)); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	for _, want := range []string{"rule alt: key part", "rule slots: its leases last 1s", "rule costly: a request costs"} {
		if !strings.Contains(all, want) {
			t.Errorf("no note %q in:\n%s", want, all)
		}
	}
	for _, want := range []string{"sluice.path", "sluice.hdr", "Bearer qt", `^/a\.b([?#].*)?$`} {
		if !strings.Contains(doc, want) {
			t.Errorf("no %q in the configuration", want)
		}
	}
	for _, absent := range []string{"sluice.alt", "sluice.slots", "sluice.costly"} {
		if strings.Contains(doc, absent) {
			t.Errorf("%s is configured though it cannot be enforced", absent)
		}
	}
}
