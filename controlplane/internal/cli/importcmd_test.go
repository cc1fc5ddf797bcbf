package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// sluicectl import ratelimit prints a policy apply accepts, and refuses what
// it cannot express with exit 2 and the place.
func TestImportRatelimitPrintsAPolicyOrThePlaceOfTheProblem(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("domain: d\ndescriptors:\n  - key: generic_key\n    value: api\n    rate_limit: {unit: minute, requests_per_unit: 60}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCtl("import", "ratelimit", "--policy", "edge", good)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	p, err := rules.ParsePolicy([]byte(out))
	if err != nil || p.Name != "edge" || len(p.Rules) != 1 || p.Rules[0].Descriptor.Domain != "d" || p.Rules[0].Limit != 60 {
		t.Fatalf("output %s: %v", out, err)
	}
	code, _, errs = runCtl("import", "ratelimit", good, bad)
	if code != ExitUsage || !strings.Contains(errs, "bad.yaml:4: descriptors[0].rate_limit.unlimited") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}
