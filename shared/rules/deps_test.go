package rules

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoOSImport checks that no package under shared/ imports os, even indirectly
// (fmt, log, encoding/json, log/slog all do), when built for the filter
// (GOOS=wasip1 GOARCH=wasm): docs/ENVOY.md, WASI and the poll_oneoff crash.
func TestNoOSImport(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not on PATH")
	}
	cmd := exec.Command(goTool, "list", "-deps", "github.com/sluice-proxy/sluice/shared/...")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := map[string]bool{"os": true, "fmt": true, "log": true, "log/slog": true, "encoding/json": true}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list printed too little: %q", out)
	}
	for _, p := range deps {
		if forbidden[p] {
			t.Errorf("shared/... depends on %s for wasip1/wasm", p)
		}
	}
}
