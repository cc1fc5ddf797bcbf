package e2e

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// walkthroughCommands returns the shell commands of the README's
// walkthrough.
func walkthroughCommands(t *testing.T) []string { return markedCommands(t, "README.md", "walkthrough") }

// markedCommands returns the ```sh blocks of file (from the repository root)
// between its "<!-- name:begin -->" and "<!-- name:end -->" markers.
func markedCommands(t *testing.T, file, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, file))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, "<!-- "+name+":begin -->"), strings.Index(s, "<!-- "+name+":end -->")
	if i < 0 || j < i {
		t.Fatalf("%s: %s markers not found", file, name)
	}
	var cmds []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(s[i:j], -1) {
		cmds = append(cmds, strings.TrimSpace(m[1]))
	}
	return cmds
}

// TestMakeRun starts `make run` as a user would (on free ports), runs the
// README's walkthrough commands against it, then stops it with SIGINT and
// checks that no process is left behind: once with the real Envoy (make envoy's
// build/envoy, which make run prefers) and once with the dev proxy
// (PROXY=devproxy). The walkthrough is the same on both.
func TestMakeRun(t *testing.T) {
	t.Run("envoy", func(t *testing.T) {
		testMakeRun(t, "", envoyproc.Binary(t, repo), "the real Envoy")
	})
	t.Run("devproxy", func(t *testing.T) { testMakeRun(t, "devproxy", "", "the dev proxy") })
}

// testMakeRun is TestMakeRun with PROXY=kind and ENVOY=envoy; make run must say
// it runs says.
func testMakeRun(t *testing.T, kind, envoy, says string) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not found (Debian package make)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not found (Debian package curl): the walkthrough uses it")
	}
	cmds := walkthroughCommands(t)
	if len(cmds) != 12 {
		t.Fatalf("README walkthrough: %d commands, want 12", len(cmds))
	}
	runDir := t.TempDir()
	addrs := proctest.FreeAddrs(t, 7)
	cp, proxy, proxy2, up, grpc, rls, rlsAdmin := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4], addrs[5], addrs[6]
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	out := &proctest.SyncBuffer{}
	cmd := exec.Command("make", "run", "CP_PORT="+port(cp), "PROXY_PORT="+port(proxy), "PROXY2_PORT="+port(proxy2), "UPSTREAM_PORT="+port(up), "RUN_DIR="+runDir,
		"GRPC_PORT="+port(grpc), "RLS_PORT="+port(rls), "RLS_ADMIN_PORT="+port(rlsAdmin))
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+adminToken, "SLUICE_READ_TOKEN="+readToken, "PROXY="+kind, "ENVOY="+envoy)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches the terminal's process group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("make run output:\n%s", out)
		}
	})
	var exitErr error
	early := false
	ready := proctest.WaitFor(5*time.Minute, func() bool {
		select {
		case exitErr = <-exited:
			early, stopped = true, true
			return true
		default:
		}
		return strings.Contains(out.String(), "sluice is running.")
	})
	switch {
	case early:
		t.Fatalf("make run exited before it was ready: %v", exitErr)
	case !ready:
		t.Fatalf("make run not ready within 5 minutes")
	}
	for _, want := range []string{"export SLUICE_ADMIN_TOKEN=" + adminToken, "export SLUICE_SERVER=http://" + cp, "access.log", "access2.log", "proxies: " + says} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("make run output lacks %q", want)
		}
	}
	// It prints the README's steps, with the ports it runs on.
	readme, _ := os.ReadFile(filepath.Join(repo, "README.md"))
	walk := string(readme)
	walk = walk[strings.Index(walk, "<!-- walkthrough:begin -->"):strings.Index(walk, "<!-- walkthrough:end -->")]
	for _, m := range regexp.MustCompile(`(?m)^\*\*(\d+\. [^*]+?)[.:]?\*\*`).FindAllStringSubmatch(walk, -1) {
		if !strings.Contains(out.String(), m[1]+"\n") {
			t.Errorf("make run output lacks the README's step %q", m[1])
		}
	}
	if c := strings.ReplaceAll(cmds[0], "127.0.0.1:10000", proxy); !strings.Contains(out.String(), c) {
		t.Errorf("make run output lacks step 1's command on its port: %q", c)
	}

	// shCode runs a walkthrough command in the repository root (where
	// build/sluicectl is) and returns its output and exit code.
	shCode := func(c string) (string, int) {
		t.Helper()
		c = strings.NewReplacer("127.0.0.1:10000", proxy, "127.0.0.1:10002", rls, "127.0.0.1:8080", cp, "build/run/", runDir+"/",
			"for p in 10000 10001", "for p in "+port(proxy)+" "+port(proxy2)).Replace(c)
		sh := exec.Command("bash", "-c", c)
		sh.Dir = repo
		// The user has pasted the two export lines make run printed, and
		// pointed sluicectl at the control plane's port.
		sh.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+adminToken, "SLUICE_READ_TOKEN="+readToken, "SLUICE_SERVER=http://"+cp)
		b, err := sh.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", c, err, b)
		}
		return strings.TrimSpace(string(b)), sh.ProcessState.ExitCode()
	}
	sh := func(c string) string {
		t.Helper()
		out, code := shCode(c)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s", c, code, out)
		}
		return out
	}
	if got := sh(cmds[0]); got != "200 200 200 200 200 429 429 429" {
		t.Errorf("step 1: %q", got)
	}
	if got := sh(cmds[1]); !strings.HasPrefix(got, "HTTP/1.1 429") || !strings.Contains(got, `"rule":"api-per-user"`) {
		t.Errorf("step 2: %q", got)
	}
	// Step 3: export, edit, diff (exit 1: one rule, one field), apply.
	sh(cmds[2])
	sh(cmds[3])
	if got, code := shCode(cmds[4]); code != 1 || !strings.Contains(got, "~ rule api-per-user") ||
		!strings.Contains(got, "limit: 5 → 100") || strings.Count(got, "→") != 1 {
		t.Errorf("step 3 (diff): exit %d, %q", code, got)
	}
	if got := sh(cmds[5]); !strings.Contains(got, "policy default configured (v1 → v2)") {
		t.Errorf("step 3 (apply): %q", got)
	}
	start := time.Now()
	if !proctest.WaitFor(10*time.Second, func() bool { return sh(cmds[6]) == "200" }) {
		t.Errorf("step 3: the raised limit is not enforced after 10s")
	}
	t.Logf("raised limit enforced %s after the apply", time.Since(start))
	var line map[string]any
	if err := json.Unmarshal([]byte(sh(cmds[7])), &line); err != nil || rateLimit(line)["rule"] != "api-per-user" || rateLimit(line)["rate_limited"] != "false" {
		t.Errorf("step 4: %v %v", line, err)
	}
	if got := sh(cmds[8]); !strings.Contains(got, "2 (current)") {
		t.Errorf("step 5 (history): %q", got)
	}
	if got := sh(cmds[9]); !strings.Contains(got, `"version"`) {
		t.Errorf("step 5 (curl): %q", got)
	}
	// The dev proxy reports itself (envoy.yaml's node.id) at the new version.
	var status string
	if !proctest.WaitFor(30*time.Second, func() bool {
		var code int
		status, code = shCode(cmds[10])
		return code == 0
	}) || !strings.Contains(status, "sluice-dev") || !strings.Contains(status, "SYNCED") {
		t.Errorf("step 5 (status): %q", status)
	}
	// The filter make built says which build it is (make's VERSION, as every
	// binary does), so a rollout can be followed: not "dev".
	if v := makeVersion(t); !strings.Contains(status, " "+v+" ") {
		t.Errorf("step 5 (status): the proxies' BUILD is not make's version %q:\n%s", v, status)
	}
	// Exactly ten admitted across both proxies; which requests get the 429s
	// depends on how the two leases split the last units.
	if got := sh(cmds[11]); strings.Count(got, "200") != 10 || strings.Count(got, "429") != 2 {
		t.Errorf("step 6 (fleet-wide limit across two proxies): %q, want ten 200s and two 429s", got)
	}

	if envoy != "" {
		rlsWalkthrough(t, sh)
	} else if strings.Contains(out.String(), "ratelimit      http://") {
		t.Errorf("make run with the dev proxy announces a ratelimit-filter Envoy it cannot run")
	}

	// The live line has counted the walkthrough's decisions per rule.
	if !proctest.WaitFor(20*time.Second, func() bool {
		return regexp.MustCompile(`==> last 5s: .*api-per-user \d+ allowed / \d+ limited`).MatchString(out.String())
	}) {
		t.Errorf("make run printed no live count of api-per-user's decisions")
	}
	// Ctrl-C: SIGINT to the foreground process group.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-exited:
		stopped = true
	case <-time.After(30 * time.Second):
		t.Fatal("make run did not stop within 30s of SIGINT")
	}
	for _, a := range []string{cp, proxy, proxy2, up, grpc, rls, rlsAdmin} {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after make run stopped", a)
		}
	}
	if left := processesMentioning(runDir); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}

// rlsWalkthrough runs docs/rls.md's "Try it with make run" commands as written
// there (sh maps the ports) and checks their answers: the rules with their
// descriptors; a burst of 45 on the 20-a-second address limit, whose first
// refusal comes after at least 20 admitted and which has refusals (at most 20
// admitted a second: a burst shorter than 2.25 s meets one); a refusal in
// that Envoy's access log, flagged RL; the limit lowered to 5 over REST and
// the next burst refused after at least 5; the policy's status SERVING.
func rlsWalkthrough(t *testing.T, sh func(string) string) {
	t.Helper()
	cmds := markedCommands(t, "docs/rls.md", "rls-walkthrough")
	if len(cmds) != 5 {
		t.Fatalf("docs/rls.md walkthrough: %d commands, want 5", len(cmds))
	}
	if got := sh(cmds[0]); !strings.Contains(got, "descriptor edge: remote_address") {
		t.Errorf("docs/rls.md step 1: %q", got)
	}
	burst := func(step, got string, limit int) {
		t.Helper()
		codes := strings.Fields(got)
		first := slices.Index(codes, "429")
		if len(codes) < 45 || first < limit || strings.Count(got, "200")+strings.Count(got, "429") != len(codes) {
			t.Errorf("docs/rls.md step %s: %q: want 45 answers, 200 or 429, at least %d admitted before the first 429, and a 429", step, got, limit)
		}
		t.Logf("docs/rls.md step %s: %d admitted, first refusal at request %d, %d refused", step, strings.Count(got, "200"), first+1, strings.Count(got, "429"))
	}
	burst("2", sh(cmds[1]), 20)
	if got := sh(cmds[2]); !strings.Contains(got, `"flags":"RL"`) {
		t.Errorf("docs/rls.md step 3: %q, want an access-log line flagged RL", got)
	}
	got := sh(cmds[3])
	if !strings.Contains(got, "limit: 20 → 5") || !strings.Contains(got, "policy edge configured") {
		t.Errorf("docs/rls.md step 4 (apply): %q", got)
	}
	lines := strings.Split(got, "\n")
	burst("4", lines[len(lines)-1], 5)
	if got := sh(cmds[4]); !strings.Contains(got, "SERVING") || !strings.Contains(got, "descriptors decided") {
		t.Errorf("docs/rls.md step 5: %q, want the policy SERVING over the RateLimitService (and exit 0)", got)
	}
}

// processesMentioning lists the command lines of running processes that
// contain s (Linux /proc).
func processesMentioning(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestMakeHelpListsEveryTarget: make help prints a line for every phony target
// of the Makefile but the default "all", from its "##" comment.
func TestMakeHelpListsEveryTarget(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, line := range strings.Split(string(mk), "\n") {
		if rest, ok := strings.CutPrefix(line, ".PHONY:"); ok {
			targets = append(targets, strings.Fields(rest)...)
		}
	}
	cmd := exec.Command("make", "-s", "help")
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	for _, target := range targets {
		if target == "all" {
			continue
		}
		if !strings.Contains(string(out), "make "+target+" ") {
			t.Errorf("make help does not list %q:\n%s", target, out)
		}
	}
}

// TestREADMEIsShortAndLinksItsDocs: the README stays a five-minute read (at most
// 250 lines) and every doc it points to exists.
func TestREADMEIsShortAndLinksItsDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 250 {
		t.Errorf("README.md has %d lines; keep it at most 250 and move reference material to docs/", n)
	}
	for _, m := range regexp.MustCompile(`\]\((docs/[^)#]+)`).FindAllStringSubmatch(string(b), -1) {
		if _, err := os.Stat(filepath.Join(repo, m[1])); err != nil {
			t.Errorf("README.md links %s: %v", m[1], err)
		}
	}
}

// makeVersion returns the VERSION make builds with (git describe, as the
// Makefile computes it).
func makeVersion(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("make", "-s", "--no-print-directory", "print-version")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make print-version: %v", err)
	}
	return strings.TrimSpace(string(out))
}
