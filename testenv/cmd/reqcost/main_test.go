package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunsStreamsAndChecksTheirStatus runs the floor plugin (which lets every
// request through) and checks that run succeeds when every request gets the
// status asked for and fails, naming the request, when one does not.
func TestRunsStreamsAndChecksTheirStatus(t *testing.T) {
	wasm := filepath.Join(t.TempDir(), "floor.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "../../../filter/testdata/floor")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the floor plugin: %v\n%s", err, out)
	}
	if err := run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-status", "200"}); err != nil {
		t.Fatalf("run: %v", err)
	}
	err := run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-status", "429"})
	if err == nil || !strings.Contains(err.Error(), "request 6: status 200, want 429") {
		t.Fatalf("run with a status no request gets: %v, want the first counted request named", err)
	}
	if err := run([]string{"-wasm", wasm, "-users", "0"}); err == nil {
		t.Fatal("run with -users 0 succeeded")
	}
}
