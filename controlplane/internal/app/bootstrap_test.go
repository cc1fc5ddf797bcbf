package app

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/controlplane/internal/config"
)

const bootstrapYAML = `policy: edge
rules:
  - {id: per-ip, algorithm: fixed_window, limit: 100, window: 1m, key: [client_ip]}
`

// TestBootstrapPolicySeedsOnlyAnEmptyStore: --bootstrap-policy creates the policy
// (YAML) as version 1 in a store that never held it; a restart keeps the version
// changed since.
func TestBootstrapPolicySeedsOnlyAnEmptyStore(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(file, []byte(bootstrapYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_DATA_DIR": filepath.Join(dir, "data")}
	args := []string{"--bootstrap-policy", file}
	version := func(c *apitest.Client) (int, string) {
		var got string
		var status int
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			r := c.Do("GET", "/v1/policies/edge", nil)
			status, got = r.Status, r.Header.Get("ETag")
			if status == 200 {
				break
			}
		}
		return status, got
	}
	c, stop := server(t, args, env)
	if st, tag := version(c); st != 200 || !strings.HasPrefix(tag, `"v1.`) {
		t.Fatalf("after the first start: %d %s, want version 1", st, tag)
	}
	if r := c.Do("PUT", "/v1/policies/edge/rules/per-ip", []byte(`{"id":"per-ip","algorithm":"fixed_window","limit":5,"window":"1m","key":["client_ip"]}`)); r.Status != 200 {
		t.Fatalf("changing the rule: %d %s", r.Status, r.Body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c, _ = server(t, args, env)
	if st, tag := version(c); st != 200 || !strings.HasPrefix(tag, `"v2.`) {
		t.Fatalf("after a restart: %d %s, want the changed version 2 kept", st, tag)
	}
	// A deleted policy is not re-created either (package api's test of Bootstrap).
}

// TestInvalidBootstrapPolicyStopsStartup: a bootstrap file that is not a valid
// policy stops the control plane at start, naming the file and the field.
func TestInvalidBootstrapPolicyStopsStartup(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(file, []byte("policy: edge\nrules:\n  - {id: r, algorithm: fixed_window, limit: -5, window: 1m}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := config.Parse([]string{"--listen", "127.0.0.1:0", "--bootstrap-policy", file, "--data-dir", filepath.Join(dir, "data")},
		func(string) string { return "" }, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), s, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Run: %v, want an error naming %s and the field", err, file)
	}
}
