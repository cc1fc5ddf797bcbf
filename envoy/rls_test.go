package envoy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
)

// ctl runs sluicectl with args and SLUICE_QUOTA_TOKEN unset, and returns its
// standard output.
func ctl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(sluicectl, args...)
	cmd.Env = append(os.Environ(), "SLUICE_QUOTA_TOKEN=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sluicectl %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// TestEnvoyRLSBootstrap: examples/rls-policy.json is what `sluicectl import
// ratelimit` makes of examples/ratelimit-config.yaml, envoy-rls.yaml what
// `sluicectl envoy-config rls` generates from it (so neither drifts from its
// generator); the bootstrap decodes strictly into go-control-plane's types,
// passes their validation, and the real Envoy validates it (--mode validate).
func TestEnvoyRLSBootstrap(t *testing.T) {
	for _, f := range []struct{ file, regen string }{
		{"../examples/rls-policy.json", "go run ./controlplane/cmd/sluicectl import ratelimit examples/ratelimit-config.yaml --policy edge > examples/rls-policy.json"},
		{"envoy-rls.yaml", "go run ./controlplane/cmd/sluicectl envoy-config rls -f examples/rls-policy.json > envoy/envoy-rls.yaml"},
	} {
		have, err := os.ReadFile(f.file)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		if strings.HasSuffix(f.file, ".json") {
			want = ctl(t, "import", "ratelimit", "../examples/ratelimit-config.yaml", "--policy", "edge")
		} else {
			want = ctl(t, "envoy-config", "rls", "-f", "../examples/rls-policy.json")
		}
		if string(have) != want {
			t.Fatalf("%s differs from its generator's output; regenerate it:\n  %s", f.file, f.regen)
		}
	}
	doc, _ := os.ReadFile("envoy-rls.yaml")
	b, err := devproxy.ParseBootstrap(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoy.filters.http.ratelimit", "DRAFT_VERSION_03", "sluice_rls", "x-user-id", "remote_address"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("the bootstrap has no %s", want)
		}
	}
	if n := len(b.GetStaticResources().GetClusters()); n != 2 {
		t.Errorf("%d clusters, want upstream and sluice_rls", n)
	}
	envoy := envoyproc.Binary(t, "..")
	out, err := exec.Command(envoy, "--mode", "validate", "-c", "envoy-rls.yaml", "--log-level", "warn").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK")) {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// TestEnvoyRLSConfigNamesWhatItCannotDo: several domains need --domain; an
// entry whose key is no header name is left out with a note naming it.
func TestEnvoyRLSConfigNamesWhatItCannotDo(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(file, []byte(`{"policy":"p","rules":[
	 {"id":"a","descriptor":{"domain":"one","entries":[{"key":"generic_key","value":"a"}]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"},
	 {"id":"b","descriptor":{"domain":"two","entries":[{"key":"bad key"}]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"},
	 {"id":"c","descriptor":{"domain":"two","entries":[{"key":"remote_address"}]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sluicectl, "envoy-config", "rls", "-f", file)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the domains one, two") {
		t.Fatalf("two domains without --domain: %v\n%s", err, out)
	}
	cmd = exec.Command(sluicectl, "envoy-config", "rls", "-f", file, "--domain", "two")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("--domain two: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), `rule b: entry "bad key" has no action that produces it`) || strings.Contains(stdout.String(), "generic_key") ||
		!strings.Contains(stdout.String(), "remote_address") {
		t.Fatalf("--domain two:\n%s\n%s", stderr.String(), stdout.String())
	}
}
