package cli

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	labWasmOnce sync.Once
	labWasmPath string
	labWasmErr  error
	labWasmDir  string
)

// labWasm returns the path of the filter module: $SLUICE_WASM (make test
// sets it), else one built for this test run.
func labWasm(t *testing.T) string {
	t.Helper()
	labWasmOnce.Do(func() {
		if p := os.Getenv("SLUICE_WASM"); p != "" {
			labWasmPath = p
			return
		}
		labWasmDir, labWasmErr = os.MkdirTemp("", "cli-wasm")
		if labWasmErr != nil {
			return
		}
		labWasmPath = filepath.Join(labWasmDir, "sluice.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", labWasmPath, "../../../filter")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			labWasmErr = fmt.Errorf("building the filter: %v\n%s", err, b)
		}
	})
	if labWasmErr != nil {
		t.Fatal(labWasmErr)
	}
	return labWasmPath
}

func runCtl(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(args, Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }})
	return code, out.String(), errb.String()
}

// The demo policy's test file passes: what make test runs.
func TestDemoPolicyTestFilePasses(t *testing.T) {
	code, out, errs := runCtl("test", "--wasm", labWasm(t), "../../../examples/default-policy.test.yaml")
	if code != ExitOK || !strings.Contains(out, "8 passed, 0 failed") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
}

// A failing step is named with its number, file line and request, what was
// expected and what came back; the exit code is 1 and the JUnit report
// counts the failure.
func TestLabTestReportsTheFailingStep(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "shop.test.yaml")
	if err := os.WriteFile(file, []byte(`policy:
  policy: shop
  identity: {user_header: x-user-id}
  rules:
    - {id: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1m}
workers: 2
tests:
  - name: two a minute
    steps:
      - {at: 0s, path: /x, headers: {x-user-id: alice}, count: 2, expect: 200}
      - {at: 1s, path: /x, headers: {x-user-id: alice}, expect: 429, expect_headers: {Retry-After: "59"}}
  - name: a wrong expectation
    steps:
      - {at: 0s, path: /x, headers: {x-user-id: bob}, count: 2, expect: 200}
      - {at: 30s, path: /x, headers: {x-user-id: bob}, expect: 200}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(dir, "junit.xml")
	code, out, errs := runCtl("test", "--wasm", labWasm(t), "--junit", junit, file)
	if code != ExitDiff {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		"ok    " + file + ": two a minute",
		"FAIL  " + file + ": a wrong expectation",
		fmt.Sprintf("step 2 (%s:15), request 1 of 1 at 30s: GET /x x-user-id=bob", file),
		"expected status 200, got 429",
		`"rate_limited":true`,
		"1 passed, 1 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var rep junitSuites
	if err := xml.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Tests != 2 || rep.Failures != 1 || rep.Suites[0].Cases[1].Failure == nil {
		t.Errorf("junit: %s", b)
	}
}

// An invalid test file exits 2 and names each problem's line; nothing runs.
func TestLabTestFileProblemsNameTheirLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.test.yaml")
	if err := os.WriteFile(file, []byte(`policy:
  rules:
    - {id: r, key: [client_ip], algorithm: token_bucket, limit: 0, window: 1m}
tests:
  - name: t
    steps:
      - {at: 2s, path: x}
      - {at: 1s, path: /y, client_ip: 300.1.1.1, expect: 42}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCtl("test", "--wasm", "/nonexistent.wasm", file)
	if code != ExitUsage || out != "" {
		t.Fatalf("exit %d, want 2\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		file + ":3: policy.rules[0].limit:",
		file + ":7: tests[0].steps[0].path: must start with /",
		file + ":8: tests[0].steps[1].client_ip:",
		file + ":8: tests[0].steps[1].expect:",
		file + ":8: tests[0].steps[1].at: 1s is before the previous step's 2s",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
}

// replay reads a log, maps a header from another member, and writes the
// report as JSON, as a table and as an SVG picture.
func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "candidate.yaml")
	if err := os.WriteFile(pol, []byte(`policy: candidate
rules:
  - {id: per-key, key: ["header:x-api-key"], algorithm: fixed_window, limit: 3, window: 1m}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	for i := range 10 {
		logged := `null`
		if i == 9 {
			logged = `"{\"rate_limited\":true,\"shadow\":false,\"rule\":\"per-key\"}"`
		}
		fmt.Fprintf(&b, `{"timestamp":%q,"method":"GET","path":"/v1/x","api_key":"k1","client_ip":"192.0.2.1","rate_limit":%s}`+"\n",
			at.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano), logged)
	}
	log := filepath.Join(dir, "access.log")
	if err := os.WriteFile(log, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	svg := filepath.Join(dir, "plot.svg")
	code, out, errs := runCtl("replay", "--wasm", labWasm(t), "--policy", pol, "--log", log, "--field", "X-Api-Key=api_key", "-o", "json", "--plot", svg)
	if code != ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	var rep struct {
		Requests int64
		Denied   int64
		Logged   struct {
			NewlyDenied  int64 `json:"newly_denied"`
			NewlyAllowed int64 `json:"newly_allowed"`
		} `json:"against_log"`
		Rules []struct {
			ID          string
			Matched     int64
			Denied      int64
			FirstDenial time.Time `json:"first_denial"`
			TopKeys     []struct {
				Key    string
				Denied int64
			} `json:"top_keys"`
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := rep.Rules[0]
	if rep.Requests != 10 || rep.Denied != 7 || r.Matched != 10 || r.Denied != 7 || !r.FirstDenial.Equal(at.Add(3*time.Second)) ||
		len(r.TopKeys) != 1 || r.TopKeys[0].Denied != 7 || !strings.Contains(r.TopKeys[0].Key, "k1") ||
		rep.Logged.NewlyDenied != 6 || rep.Logged.NewlyAllowed != 0 {
		t.Errorf("report:\n%s", out)
	}
	pic, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(pic, new(struct{ XMLName xml.Name })); err != nil || !strings.Contains(string(pic), "per-key") {
		t.Errorf("plot is not an SVG naming the rule (%v):\n%s", err, pic)
	}
	code, out, errs = runCtl("replay", "--wasm", labWasm(t), "--policy", pol, "--log", log, "--field", "x-api-key=api_key")
	if code != ExitOK || !strings.Contains(out, "10 requests from 2026-05-01T10:00:00Z") || !strings.Contains(out, "6 newly denied") {
		t.Errorf("table: exit %d\n%s%s", code, out, errs)
	}
}

// TestReplayChecksItsOutputFilesBeforeTheRun: a --plot that cannot be written is
// a usage error found before anything is replayed, not after the whole run; a
// --junit of sluicectl test likewise.
func TestReplayChecksItsOutputFilesBeforeTheRun(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(pol, []byte("policy: p\nrules:\n  - {id: r, key: [client_ip], algorithm: fixed_window, limit: 3, window: 1m}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "access.log")
	if err := os.WriteFile(log, []byte(`{"timestamp":"2026-05-01T10:00:00Z","method":"GET","path":"/x","client_ip":"192.0.2.1"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "no-such-dir", "plot.svg")
	code, out, errs := runCtl("replay", "--wasm", labWasm(t), "--policy", pol, "--log", log, "-o", "json", "--plot", bad)
	if code != ExitUsage || !strings.Contains(errs, "--plot") || strings.Contains(out, `"requests"`) {
		t.Fatalf("replay --plot %s: exit %d, stderr %q, stdout %q; want exit 2 naming --plot before any report", bad, code, errs, out)
	}
}

// TestTestHelpListsEveryExitCode: sluicectl test --help names the exit code of a
// failed filter (3) beside the others.
func TestTestHelpListsEveryExitCode(t *testing.T) {
	_, out, _ := runCtl("test", "--help")
	for _, want := range []string{"0 every test passed", "1 a test failed", "2 a file", "3 the filter failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("sluicectl test --help lacks %q:\n%s", want, out)
		}
	}
}

// TestTestFilesMayReuseStepsWithAnchors: a step written once with an anchor
// (&req) is reused by an alias (*req) or merged into another step (<<: *req,
// the step's own keys winning), as YAML says.
func TestTestFilesMayReuseStepsWithAnchors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "anchors.test.yaml")
	if err := os.WriteFile(file, []byte(`policy:
  policy: p
  identity: {user_header: x-user-id}
  rules:
    - {id: r, key: [user], algorithm: fixed_window, limit: 2, window: 1m}
tests:
  - name: anchors
    steps:
      - &req {at: 0s, path: /a, headers: {x-user-id: u}, expect: 200}
      - *req
      - {<<: *req, expect: 429}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCtl("test", "--wasm", labWasm(t), file); code != 0 || !strings.Contains(out, "1 passed, 0 failed") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
}
