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
	if err := os.WriteFile(bad, []byte("domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    share_threshold: true\n"), 0o600); err != nil {
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
	if code != ExitUsage || !strings.Contains(errs, "bad.yaml:5: descriptors[0].share_threshold") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

// Without --policy the policy is named after the files' domain; several
// domains, or one that is no policy name, ask for --policy. A file that is
// not YAML is refused naming the line at fault, not the line its block
// began on.
func TestImportNamesThePolicyAfterTheDomainAndASyntaxErrorItsLine(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	api := write("api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	web := write("web.yaml", "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	slash := write("eg.yaml", "domain: default/eg/http\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	indent := write("indent.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n     requests_per_unit: 3\n")
	code, out, errs := runCtl("import", "ratelimit", api)
	if p, err := rules.ParsePolicy([]byte(out)); code != ExitOK || err != nil || p.Name != "api" {
		t.Fatalf("one domain: exit %d %s %v", code, errs, err)
	}
	for _, files := range [][]string{{api, web}, {slash}} {
		if code, _, errs := runCtl(append([]string{"import", "ratelimit"}, files...)...); code != ExitUsage || !strings.Contains(errs, "--policy") {
			t.Errorf("%v: exit %d %q, want a request for --policy", files, code, errs)
		}
	}
	if code, _, errs := runCtl("import", "ratelimit", "--policy", "x", indent); code != ExitUsage || !strings.Contains(errs, "indent.yaml:6: not YAML") {
		t.Errorf("a bad indent on line 6: exit %d %q", code, errs)
	}
}

// The imported example's test file, whose steps are rate limit descriptors,
// passes; a wrong expectation names the step and what came back.
func TestDescriptorStepsAskTheRateLimitService(t *testing.T) {
	code, out, errs := runCtl("test", "--wasm", labWasm(t), "../../../examples/rls-policy.test.yaml")
	if code != ExitOK || !strings.Contains(out, "3 passed, 0 failed") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.json"), []byte(`{"policy":"p","rules":[
	 {"id":"d","descriptor":{"domain":"d","name":"d","entries":[{"key":"k","value":"v"}]},"algorithm":"fixed_window","limit":2,"window":"1m","scope":"fleet"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "p.test.yaml")
	if err := os.WriteFile(file, []byte("policy: p.json\ntests:\n  - name: two\n    steps:\n      - {at: 0s, domain: d, descriptor: [{k: v}], count: 3, expect: 200}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCtl("test", "--wasm", labWasm(t), file)
	if code != 1 || !strings.Contains(out, "request 3 of 3 at 0s: descriptor d k=v") || !strings.Contains(out, "expected status 200, got 429") ||
		!strings.Contains(out, `"rule":"d"`) {
		t.Fatalf("exit %d\n%s", code, out)
	}
	if err := os.WriteFile(file, []byte("policy: p.json\ntests:\n  - name: bad\n    steps:\n      - {at: 0s, domain: d, path: /x, descriptor: [{k: v}]}\n      - {at: 0s, domain: d}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCtl("test", "--wasm", labWasm(t), file)
	if code != ExitUsage || !strings.Contains(errs, "a descriptor step has no path") || !strings.Contains(errs, "domain and descriptor go together") {
		t.Fatalf("exit %d\n%s", code, errs)
	}
}
