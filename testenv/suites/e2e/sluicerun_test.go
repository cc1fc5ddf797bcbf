package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// sluiceRun is one sluice-run process (what `make run` starts) on free
// ports, with its combined output.
type sluiceRun struct {
	cmd    *exec.Cmd
	out    *proctest.SyncBuffer
	cp     string
	exited chan error
	done   bool
}

// startSluiceRun starts sluice-run from the repository root with the
// binaries of binDir and runDir for its data and logs.
func startSluiceRun(t *testing.T, runDir string) *sluiceRun {
	t.Helper()
	cp, proxy, up := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	r := &sluiceRun{out: &proctest.SyncBuffer{}, cp: cp, exited: make(chan error, 1)}
	r.cmd = exec.Command(filepath.Join(binDir, "sluice-run"))
	r.cmd.Dir = repo
	r.cmd.Env = append(os.Environ(), "CP_PORT="+port(cp), "PROXY_PORT="+port(proxy), "UPSTREAM_PORT="+port(up),
		"RUN_DIR="+runDir, "BIN_DIR="+binDir, "REDIS_URL=", "WORKERS=2",
		"SLUICE_ADMIN_TOKEN="+adminToken, "SLUICE_READ_TOKEN="+readToken)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- r.cmd.Wait() }()
	t.Cleanup(func() {
		if !r.done {
			syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.exited
		}
		if t.Failed() {
			t.Logf("sluice-run output:\n%s", r.out)
		}
	})
	return r
}

// await waits until the output contains s; it fails the test if the
// process exits first or 3 minutes pass.
func (r *sluiceRun) await(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(r.out.String(), s) {
		select {
		case err := <-r.exited:
			r.done = true
			t.Fatalf("sluice-run exited (%v) before printing %q", err, s)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice-run did not print %q within 3 minutes", s)
		}
	}
}

// stop sends SIGINT (Ctrl-C) and waits for the exit.
func (r *sluiceRun) stop(t *testing.T) {
	t.Helper()
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-r.exited:
		r.done = true
	case <-time.After(30 * time.Second):
		t.Fatal("sluice-run did not stop within 30s of SIGINT")
	}
}

// request sends an admin-token request to the control plane.
func (r *sluiceRun) request(t *testing.T, method, path, doc string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+r.cp+path, strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ownPolicy is a policy a user's script applies as "default".
const ownPolicy = `{"policy":"default","rules":[{"id":"mine","match":{"path_prefix":"/mine/"},"algorithm":"fixed_window","limit":3,"window":"1m"}]}`

// TestRunAcceptsALaterPolicy: a script starts make run and applies its own
// policy as soon as the control plane took the demo. The filter then pulls
// the script's version, not the demo's, and make run must take that (or
// any later version) as ready instead of giving up and stopping everything.
func TestRunAcceptsALaterPolicy(t *testing.T) {
	r := startSluiceRun(t, t.TempDir())
	r.await(t, "starting the demo upstream") // the demo policy is applied; the dev proxy is not started yet
	if code, b := r.request(t, http.MethodPut, "/v1/policies/default", ownPolicy); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("PUT: %d %s", code, b)
	}
	r.await(t, "sluice is running.")
	r.stop(t)
}

// TestRunKeepsTheStoredPolicy: a second make run over the same data keeps
// the policy the user changed during the first, instead of applying the
// demo over it, and says so.
func TestRunKeepsTheStoredPolicy(t *testing.T) {
	runDir := t.TempDir()
	r := startSluiceRun(t, runDir)
	r.await(t, "sluice is running.")
	code, changed := r.request(t, http.MethodPut, "/v1/policies/default", ownPolicy)
	if code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, changed)
	}
	r.stop(t)

	r = startSluiceRun(t, runDir)
	r.await(t, "sluice is running.")
	if !strings.Contains(r.out.String(), `keeping the stored policy "default"`) {
		t.Errorf("the second run does not say it keeps the stored policy")
	}
	code, got := r.request(t, http.MethodGet, "/v1/policies/default", "")
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, got)
	}
	var a, b struct {
		Version uint64
		Rules   []struct{ ID string }
	}
	json.Unmarshal(changed, &a)
	json.Unmarshal(got, &b)
	if a.Version == 0 || b.Version != a.Version || len(b.Rules) != 1 || b.Rules[0].ID != "mine" {
		t.Errorf("after the second run: %s, want the changed policy %s", got, bytes.TrimSpace(changed))
	}
	r.stop(t)
}
