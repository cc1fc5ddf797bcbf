package main

import (
	"io"
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
	if err := run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-status", "200"}, nil, io.Discard); err != nil {
		t.Fatalf("run: %v", err)
	}
	err := run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-status", "429"}, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "request 6: status 200, want 429") {
		t.Fatalf("run with a status no request gets: %v, want the first counted request named", err)
	}
	if err := run([]string{"-wasm", wasm, "-users", "0"}, nil, io.Discard); err == nil {
		t.Fatal("run with -users 0 succeeded")
	}

	// -pause: "ready" before the counted requests, "done" after, each
	// waiting for a line; without the second line the run fails.
	var out strings.Builder
	if err := run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-pause"}, strings.NewReader("go\ngo\n"), &out); err != nil {
		t.Fatalf("run -pause: %v", err)
	}
	if out.String() != "ready\ndone\n" {
		t.Fatalf("run -pause printed %q, want ready and done", out.String())
	}
	err = run([]string{"-wasm", wasm, "-warm", "5", "-n", "20", "-pause"}, strings.NewReader("go\n"), io.Discard)
	if err == nil || !strings.Contains(err.Error(), `waiting after "done"`) {
		t.Fatalf("run -pause with one line of input: %v, want it to fail waiting after done", err)
	}
}
