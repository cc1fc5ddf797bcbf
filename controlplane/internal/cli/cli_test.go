package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/app"
	"github.com/sluice-proxy/sluice/controlplane/internal/config"
)

const (
	adminTok = "admin-token-for-tests"
	readTok  = "read-token-for-tests"
)

// startControlPlane runs the real control plane (app.Run, embedded store)
// on a free loopback port, with extra flags, and returns its URL.
func startControlPlane(t *testing.T, extra ...string) string {
	t.Helper()
	s, err := config.Parse(append([]string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--admin-token", adminTok, "--read-token", readTok}, extra...), func(string) string { return "" }, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, s, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a net.Addr) { addr <- a })
	}()
	var a net.Addr
	select {
	case a = <-addr:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the control plane did not start listening")
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return "http://" + a.String()
}

// ctl runs sluicectl as a user would, against server.
type ctl struct {
	t           *testing.T
	server      string
	beforeWrite func(string)
}

type result struct {
	code           int
	stdout, stderr string
}

func (c *ctl) run(stdin string, args ...string) result {
	c.t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"SLUICE_SERVER": c.server, "SLUICE_ADMIN_TOKEN": adminTok, "SLUICE_READ_TOKEN": readTok, "USER": "tester"}
	code := Main(args, Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return env[k] }, beforeWrite: c.beforeWrite})
	return result{code, out.String(), errb.String()}
}

func (c *ctl) must(want int, args ...string) result {
	c.t.Helper()
	r := c.run("", args...)
	if r.code != want {
		c.t.Fatalf("sluicectl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
	}
	return r
}

const demoV1 = `# the demo policy
policy: demo
identity:
  user_header: x-user-id
rules:
  - id: per-user
    algorithm: token_bucket
    key: [user]
    limit: 5
    window: 1m
  - id: login
    algorithm: fixed_window
    match: {path: /login, methods: [POST]}
    limit: 3
    window: 1m
`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustContain(t *testing.T, what, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(s, p) {
			t.Fatalf("%s lacks %q:\n%s", what, p, s)
		}
	}
}

// TestApplyDiffHistoryRollback drives sluicectl against a real control
// plane: apply a YAML file, change one rule, diff shows exactly that change
// and exits 1, apply applies it, history lists it, rollback restores it.
func TestApplyDiffHistoryRollback(t *testing.T) {
	c := &ctl{t: t, server: startControlPlane(t)}
	dir := t.TempDir()
	f := writeFile(t, dir, "demo.yaml", demoV1)

	r := c.must(0, "apply", "-f", f)
	mustContain(t, "first apply", r.stdout, "policy demo: new", "policy demo created (v1)")
	r = c.must(0, "diff", "-f", f)
	mustContain(t, "diff after apply", r.stdout, "policy demo: unchanged (server v1)")
	r = c.must(0, "apply", "-f", f)
	if strings.Contains(r.stdout, "configured") {
		t.Fatalf("an unchanged policy was written:\n%s", r.stdout)
	}

	// One rule changed: the diff names exactly that rule and field.
	writeFile(t, dir, "demo.yaml", strings.Replace(demoV1, "limit: 5", "limit: 10", 1))
	r = c.must(1, "diff", "-f", f)
	mustContain(t, "diff", r.stdout, "1 rule(s) changed, 0 added, 0 removed", "~ rule per-user", "limit: 5 → 10")
	if strings.Contains(r.stdout, "login") || strings.Count(r.stdout, "→") != 1 {
		t.Fatalf("the diff shows more than the change:\n%s", r.stdout)
	}
	r = c.must(0, "apply", "--dry-run", "-f", f)
	mustContain(t, "dry run", r.stdout, "server dry run passed; would be v2")
	c.must(1, "diff", "-f", f) // the dry run wrote nothing
	r = c.must(0, "apply", "-f", f)
	mustContain(t, "apply", r.stdout, "limit: 5 → 10", "policy demo configured (v1 → v2)")
	c.must(0, "diff", "-f", f)

	r = c.must(0, "get", "demo", "per-user", "-o", "json")
	mustContain(t, "get rule", r.stdout, `"limit": 10`)
	r = c.must(0, "get")
	mustContain(t, "get", r.stdout, "POLICY", "demo", "2")
	r = c.must(0, "get", "demo", "-o", "yaml")
	mustContain(t, "get -o yaml", r.stdout, "policy: demo", "version: 2")

	r = c.must(0, "history", "demo")
	mustContain(t, "history", r.stdout, "2 (current)", "sluicectl:tester", "put_policy")
	r = c.must(0, "history", "demo", "--version", "2")
	mustContain(t, "history --version 2", r.stdout, "policy demo v2, against v1: 1 rule(s) changed", "~ rule per-user", "limit: 5 → 10")
	r = c.must(0, "history", "demo", "--version", "1")
	mustContain(t, "history --version 1", r.stdout, "against no rules", "+ rule per-user")
	c.must(3, "history", "demo", "--version", "9") // the server's 404 version_not_found

	// A descriptor rule's table line shows its descriptor and whether it is shadow.
	c.run(`{"policy":"edge","rules":[{"id":"per-user","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"api"},{"key":"user"}]},
	  "algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet","shadow":true}]}`, "apply", "-f", "-")
	r = c.must(0, "get", "edge")
	mustContain(t, "get a descriptor rule", r.stdout, "SHADOW", "descriptor edge: generic_key=api,user", "yes")
	r = c.must(0, "rollback", "demo", "--to", "1")
	mustContain(t, "rollback", r.stdout, "rolled back to v1 (now v3)")
	r = c.must(0, "get", "demo", "per-user", "-o", "json")
	mustContain(t, "after rollback", r.stdout, `"limit": 5`)
	r = c.must(1, "diff", "-f", f) // the file still says 10
	mustContain(t, "diff after rollback", r.stdout, "limit: 5 → 10")

	// Rules added and removed, and a policy from standard input.
	r = c.run("policy: demo\nrules:\n  - {id: login, algorithm: fixed_window, match: {path: /login, methods: [POST]}, limit: 3, window: 1m}\n  - {id: new, algorithm: gcra, limit: 2, window: 1s}\n", "diff", "-f", "-")
	if r.code != 1 {
		t.Fatalf("diff from stdin: %d %s %s", r.code, r.stdout, r.stderr)
	}
	mustContain(t, "diff stdin", r.stdout, "+ rule new", "- rule per-user", "algorithm: \"gcra\"")

	// delete asks first: anything but y keeps the policy.
	if r := c.run("n\n", "delete", "demo"); r.code != 2 || !strings.Contains(r.stderr, "not deleted") {
		t.Fatalf("delete answered n: %d %q", r.code, r.stderr)
	}
	c.must(0, "get", "demo")
	if r := c.run("y\n", "delete", "demo", "login"); r.code != 0 {
		t.Fatalf("delete answered y: %d %q", r.code, r.stderr)
	}
	c.must(0, "delete", "--yes", "demo")
	c.must(3, "get", "demo")
}

// TestInvalidFileChangesNothing: an invalid file fails with file, line and
// field named, exit 2, and nothing is written, not even the valid files
// applied with it.
func TestInvalidFileChangesNothing(t *testing.T) {
	c := &ctl{t: t, server: startControlPlane(t)}
	dir := t.TempDir()
	writeFile(t, dir, "a-good.yaml", demoV1)
	writeFile(t, dir, "b-bad.yaml", "policy: bad\nrules:\n  - id: r\n    algorithm: fixed_window\n    limit: 3\n    window: soon\n")
	r := c.run("", "apply", "-f", dir)
	if r.code != ExitUsage {
		t.Fatalf("exit %d, want 2:\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustContain(t, "stderr", r.stderr, filepath.Join(dir, "b-bad.yaml")+":6: rules[0].window:")
	c.must(3, "get", "demo")
	c.must(3, "get", "bad")

	r = c.run("", "validate", "-f", writeFile(t, dir, "c.json", `{"policy":"c","rules":[{"id":"r","algorithm":"nope","limit":1,"window":"1m"}],"extra":1}`))
	if r.code != ExitUsage {
		t.Fatalf("validate: exit %d", r.code)
	}
	mustContain(t, "validate", r.stderr, "c.json:1: rules[0].algorithm:", "extra")
	r = c.run("", "validate", "-f", writeFile(t, dir, "d.yaml", "policy: d\nrules: [\n"))
	if r.code != ExitUsage || !strings.Contains(r.stderr, "d.yaml") {
		t.Fatalf("broken YAML: exit %d %s", r.code, r.stderr)
	}
	// The name comes from the file when "policy" is absent.
	r = c.must(0, "validate", "-f", writeFile(t, dir, "from-name.yaml", "rules: []\n"))
	mustContain(t, "validate", r.stdout, "policy from-name is valid")
	c.must(2, "rollback", "demo")
	c.must(2, "get", "-o", "xml")
	c.must(2, "apply")
}

// TestConcurrentChangeIsReported: a change made between apply's read (the
// diff) and its write is refused by If-Match and reported, not overwritten.
func TestConcurrentChangeIsReported(t *testing.T) {
	c := &ctl{t: t, server: startControlPlane(t)}
	dir := t.TempDir()
	f := writeFile(t, dir, "demo.yaml", demoV1)
	c.must(0, "apply", "-f", f)
	writeFile(t, dir, "demo.yaml", strings.Replace(demoV1, "limit: 5", "limit: 10", 1))
	c.beforeWrite = func(policy string) {
		// Someone else changes the policy meanwhile, with plain HTTP.
		req, _ := http.NewRequest(http.MethodPut, c.server+"/v1/policies/"+policy,
			strings.NewReader(`{"rules":[{"id":"per-user","algorithm":"token_bucket","limit":7,"window":"1m"}]}`))
		req.Header.Set("Authorization", "Bearer "+adminTok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("concurrent PUT: %v %v", err, resp)
		}
		resp.Body.Close()
	}
	r := c.run("", "apply", "-f", f)
	if r.code != ExitServer {
		t.Fatalf("exit %d, want 3:\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustContain(t, "stderr", r.stderr, "policy demo changed on the server since it was read", "nothing was written")
	c.beforeWrite = nil
	r = c.must(0, "get", "demo", "per-user", "-o", "json")
	mustContain(t, "the concurrent change", r.stdout, `"limit": 7`)
}

func TestUnreachableServerExits3(t *testing.T) {
	c := &ctl{t: t, server: "http://127.0.0.1:1"}
	c.must(3, "get")
	c.must(2, "get", "--server", "ftp://x")
}

// TestServerThatIsNotAControlPlaneIsNeverASuccess: pointed at a web server that
// answers every request 200 (one echoing the request as JSON, headers
// included, as the demo upstream does; one answering HTML), apply fails with
// exit 3 naming --server and SLUICE_SERVER, and prints no token.
func TestServerThatIsNotAControlPlaneIsNeverASuccess(t *testing.T) {
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		b, _ := json.Marshal(map[string]any{"method": r.Method, "path": r.URL.Path, "headers": r.Header})
		w.Write(b)
	}))
	defer echo.Close()
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html>hello</html>"))
	}))
	defer html.Close()
	file := writeFile(t, t.TempDir(), "demo.yaml", demoV1)
	for _, srv := range []string{echo.URL, html.URL} {
		c := &ctl{t: t, server: srv}
		for _, args := range [][]string{{"apply", "-f", file}, {"diff", "-f", file}, {"get", "demo"}} {
			r := c.run("", args...)
			if r.code != ExitServer {
				t.Errorf("sluicectl %s against %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), srv, r.code, ExitServer, r.stdout, r.stderr)
			}
			mustContain(t, "stderr", r.stderr, "not answer as a sluice control plane", "--server", "SLUICE_SERVER")
			if strings.Contains(r.stdout+r.stderr, adminTok) || strings.Contains(r.stdout+r.stderr, readTok) {
				t.Errorf("sluicectl %s printed a token:\n%s%s", strings.Join(args, " "), r.stdout, r.stderr)
			}
		}
	}
}

// TestUnreachableServerNamesTheSetting: a refused connection names the
// address and where it came from.
func TestUnreachableServerNamesTheSetting(t *testing.T) {
	c := &ctl{t: t, server: "http://127.0.0.1:1"}
	r := c.run("", "get")
	mustContain(t, "stderr", r.stderr, "http://127.0.0.1:1", "--server", "SLUICE_SERVER")
}

// TestSyntaxErrorsNameTheirLineAndColumn: a YAML or JSON file that does not parse
// is reported at the offending token's line and column, not the line before.
func TestSyntaxErrorsNameTheirLineAndColumn(t *testing.T) {
	c := &ctl{t: t, server: "http://127.0.0.1:1"}
	dir := t.TempDir()
	for name, tc := range map[string]struct{ doc, want string }{
		"bracket.yaml": {"policy: x\nrules:\n  - id: a\n    algorithm: fixed_window\n    limit: 5\n    window: [1m\n", "bracket.yaml:6:13: "},
		"indent.yaml":  {"policy: x\nrules:\n  - id: a\n    algorithm: fixed_window\n   limit: 5\n    window: 1m\n", "indent.yaml:5:4: "},
		"comma.json":   {"{\"policy\":\"x\",\n\"rules\":[\n{\"id\":\"a\",\n\"limit\":5,,\n}]}", "comma.json:4:11: "},
	} {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(tc.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		r := c.must(2, "validate", "-f", f)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: %q, want it to name %q", name, r.stderr, tc.want)
		}
	}
}

// TestApplyRefusesAFileExportedFromAnOlderVersion: a file exported at v1 (its
// "version" member) does not silently undo v2 and v3 on the server: apply shows
// the diff, names both versions, writes nothing and exits 3, unless --force; a
// file without a version, or at the server's version, applies as before.
func TestApplyRefusesAFileExportedFromAnOlderVersion(t *testing.T) {
	c := &ctl{t: t, server: startControlPlane(t)}
	dir := t.TempDir()
	f := writeFile(t, dir, "demo.yaml", demoV1)
	c.must(0, "apply", "-f", f)
	exported := c.must(0, "get", "demo", "-o", "yaml").stdout
	if !strings.Contains(exported, "version: 1") {
		t.Fatalf("the export carries no version:\n%s", exported)
	}
	writeFile(t, dir, "demo.yaml", strings.Replace(demoV1, "limit: 5", "limit: 6", 1))
	c.must(0, "apply", "-f", f) // v2
	writeFile(t, dir, "demo.yaml", strings.Replace(demoV1, "limit: 5", "limit: 7", 1))
	c.must(0, "apply", "-f", f) // v3

	old := writeFile(t, dir, "old.yaml", strings.Replace(exported, "limit: 3", "limit: 4", 1))
	r := c.must(3, "apply", "-f", old)
	mustContain(t, "stale apply", r.stdout, "limit: 7 → 5", "limit: 3 → 4")
	mustContain(t, "stale apply", r.stderr, "v1", "v3", "--force")
	if got := c.must(0, "get", "demo", "per-user", "-o", "json").stdout; !strings.Contains(got, `"limit": 7`) {
		t.Fatalf("a stale file was written:\n%s", got)
	}
	r = c.must(0, "apply", "--force", "-f", old)
	mustContain(t, "forced apply", r.stdout, "policy demo configured (v3 → v4)")

	current := c.must(0, "get", "demo", "-o", "yaml").stdout
	cur := writeFile(t, dir, "cur.yaml", strings.Replace(current, "limit: 4", "limit: 2", 1))
	r = c.must(0, "apply", "-f", cur)
	mustContain(t, "apply at the server's version", r.stdout, "(v4 → v5)")
}

func TestVersionNamesTheRelease(t *testing.T) {
	c := &ctl{t: t, server: "http://127.0.0.1:1"}
	r := c.must(0, "--version")
	mustContain(t, "sluicectl --version", r.stdout, "sluicectl ", "go1.")
}

// TestApplyShowsWhatTheServerWarnsOf: a control plane serving Envoy's own
// quota filter (gRPC listener) accepts a fleet rule whose fixed window is
// shorter than that filter's report interval, and says it will serve it poorly;
// sluicectl prints that warning and succeeds. A rule with a 5 s window, or a
// control plane without the gRPC listener, draws none.
func TestApplyShowsWhatTheServerWarnsOf(t *testing.T) {
	short := `policy: fleet
identity: {user_header: x-user-id}
rules:
  - {id: per-tenant, key: [user], algorithm: fixed_window, limit: 100, window: 2s, scope: fleet}
`
	long := strings.Replace(short, "window: 2s", "window: 5s", 1)
	dir := t.TempDir()
	l := net.ListenConfig{}
	ln, err := l.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := ln.Addr().String()
	ln.Close()
	c := &ctl{t: t, server: startControlPlane(t, "--grpc-listen", grpcAddr, "--quota-token", "quota-token-for-tests")}
	r := c.must(0, "apply", "-f", writeFile(t, dir, "short.yaml", short))
	mustContain(t, "stderr", r.stderr, "Warning: rule per-tenant: its fixed window of 2s is shorter than the report interval of Envoy's rate_limit_quota filter (5s)")
	r = c.must(0, "apply", "-f", writeFile(t, dir, "long.yaml", long))
	if strings.Contains(r.stderr, "Warning") {
		t.Errorf("a 5 s window drew a warning:\n%s", r.stderr)
	}
	plain := &ctl{t: t, server: startControlPlane(t)}
	if r := plain.must(0, "apply", "-f", writeFile(t, dir, "short2.yaml", short)); strings.Contains(r.stderr, "Warning") {
		t.Errorf("a control plane without Envoy's quota filter to serve warned:\n%s", r.stderr)
	}
}

// TestApplyDryRunOfANewPolicyPasses: a dry run of a policy the server does not
// have yet (the server answers 201 with X-Sluice-Dry-Run and no ETag, since
// nothing was written) passes, and writes nothing: a CI gate can run it on a
// newly added policy file.
func TestApplyDryRunOfANewPolicyPasses(t *testing.T) {
	c := &ctl{t: t, server: startControlPlane(t)}
	f := writeFile(t, t.TempDir(), "demo.yaml", demoV1)
	r := c.must(0, "apply", "--dry-run", "-f", f)
	mustContain(t, "dry run of a new policy", r.stdout, "policy demo: new", "server dry run passed; would be v1 (nothing written)")
	r = c.must(1, "diff", "-f", f)
	mustContain(t, "diff after the dry run", r.stdout, "policy demo: new")
}
