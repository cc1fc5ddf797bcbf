package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/controlplane/internal/config"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

func TestMainRefusesToStartWithoutTokens(t *testing.T) {
	var stderr bytes.Buffer
	code := Main([]string{"--listen", "0.0.0.0:0", "--data-dir", t.TempDir()}, func(string) string { return "" }, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "refusing to serve an unauthenticated API") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestMainBadFlag(t *testing.T) {
	var stderr bytes.Buffer
	if code := Main([]string{"--bogus"}, func(string) string { return "" }, &stderr); code != 2 {
		t.Fatalf("exit %d", code)
	}
}

// server runs Run in the background and returns a client and a stop
// function that cancels it and returns Run's error.
func server(t *testing.T, args []string, env map[string]string) (*apitest.Client, func() error) {
	t.Helper()
	a, stop := serve(t, args, env)
	return apitest.New(t, "http://"+a.String(), env["SLUICE_ADMIN_TOKEN"]), stop
}

// serve is server without the client: it returns the bound address.
func serve(t *testing.T, args []string, env map[string]string) (net.Addr, func() error) {
	t.Helper()
	s, err := config.Parse(append([]string{"--listen", "127.0.0.1:0"}, args...), func(k string) string { return env[k] }, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, s, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a net.Addr) { addr <- a })
	}()
	var a net.Addr
	select {
	case a = <-addr:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not start listening")
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("Run did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return a, stop
}

const doc = `{"policy":"p","rules":[{"id":"r1","algorithm":"fixed_window","limit":1,"window":"1m"}]}`

// TestEmbeddedDurableAndGracefulShutdown: the default (embedded) store keeps
// policies across a restart, and shutdown answers open long polls with 304.
func TestEmbeddedDurableAndGracefulShutdown(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_DATA_DIR": dir}
	c, stop := server(t, nil, env)
	created := c.Do("PUT", "/v1/policies/p", []byte(doc))
	if created.Status != 201 {
		t.Fatalf("PUT → %d %s", created.Status, created.Body)
	}
	polled := make(chan *apitest.Response, 1)
	go func() { polled <- c.Do("GET", "/v1/policies/p?wait=60s", nil, "If-None-Match", created.ETag()) }()
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Contains(c.Do("GET", "/metrics", nil).Body, []byte("sluice_controlplane_watchers 1\n")) {
		if time.Now().After(deadline) {
			t.Fatal("long poll never opened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	select {
	case r := <-polled:
		if r.Status != 304 {
			t.Fatalf("long poll at shutdown → %d", r.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long poll not answered at shutdown")
	}

	c2, _ := server(t, nil, env)
	r := c2.Do("GET", "/v1/policies/p", nil)
	if r.Status != 200 || r.ETag() != created.ETag() { // the file's epoch is stable
		t.Fatalf("after restart GET → %d %s %s", r.Status, r.ETag(), r.Body)
	}
	if r := c2.Do("GET", "/v1/policies/p/versions", nil); r.Status != 200 || !bytes.Contains(r.Body, []byte(`"put_policy"`)) {
		t.Fatalf("history after restart → %d %s", r.Status, r.Body)
	}
}

func TestRedisStore(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	c, stop := server(t, []string{"--redis-url", srv.URL()}, map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_READ_TOKEN": "rd"})
	if r := c.Do("PUT", "/v1/policies/p", []byte(doc)); r.Status != 201 {
		t.Fatalf("PUT → %d %s", r.Status, r.Body)
	}
	if r := c.Do("GET", "/readyz", nil); r.Status != 200 {
		t.Fatalf("readyz → %d", r.Status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c2, _ := server(t, []string{"--redis-url", srv.URL()}, map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_READ_TOKEN": "rd"})
	c2.Token = "rd"
	if r := c2.Do("GET", "/v1/policies/p", nil); r.Status != 200 {
		t.Fatalf("second instance GET → %d", r.Status)
	}
}

// TestEmptyStoreFileStopsStartup: an existing store file that is not a
// valid store (here empty, as a failed copy leaves it) stops the binary with
// an error naming the file, instead of serving no policies.
func TestEmptyStoreFileStopsStartup(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sluice.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stderr := runUntilListening(t, []string{"--data-dir", dir})
	if code != 1 || !strings.Contains(stderr, filepath.Join(dir, "sluice.db")) || !strings.Contains(stderr, "--reset-damaged-store") {
		t.Fatalf("exit %d, stderr %q; want 1 and an error naming the file and the way out", code, stderr)
	}
}

// TestDamagedStoreFileStopsStartup: a truncated store file is an error, not
// a panic.
func TestDamagedStoreFileStopsStartup(t *testing.T) {
	dir := t.TempDir()
	_, stop := server(t, nil, map[string]string{"SLUICE_DATA_DIR": dir})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sluice.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	code, stderr := runUntilListening(t, []string{"--data-dir", dir})
	if code != 1 || !strings.Contains(stderr, path) || strings.Contains(stderr, "goroutine") {
		t.Fatalf("exit %d, stderr %q; want 1 and an error naming the file", code, stderr)
	}
	// On purpose: move it aside and start empty.
	c, stop := server(t, []string{"--reset-damaged-store"}, map[string]string{"SLUICE_DATA_DIR": dir})
	if r := c.Do("GET", "/v1/policies", nil); r.Status != 200 {
		t.Fatalf("after --reset-damaged-store: %d %s", r.Status, r.Body)
	}
	stop()
	if m, _ := filepath.Glob(path + ".damaged-*"); len(m) != 1 {
		t.Fatalf("damaged file kept as %v, want one copy", m)
	}
}

// TestRedisPasswordNeverLogged: a bad Redis URL is reported without its
// password.
func TestRedisPasswordNeverLogged(t *testing.T) {
	var stderr bytes.Buffer
	code := Main([]string{"--listen", "127.0.0.1:0", "--redis-url", "redis://u:SECRET@127.0.0.1:notaport/0"}, func(string) string { return "" }, &stderr)
	if code == 0 || strings.Contains(stderr.String(), "SECRET") || !strings.Contains(stderr.String(), "notaport") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

// runUntilListening runs Run with args and returns its exit code (as Main
// would give it) and log output; a Run that starts listening is stopped and
// reported as a test failure.
func runUntilListening(t *testing.T, args []string) (int, string) {
	t.Helper()
	s, err := config.Parse(append([]string{"--listen", "127.0.0.1:0"}, args...), func(string) string { return "" }, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = Run(ctx, s, NewLogger(s, &out), func(net.Addr) {
		t.Errorf("started serving with %v", args)
		cancel()
	})
	if err == nil {
		return 0, out.String()
	}
	return 1, err.Error() + "\n" + out.String()
}
