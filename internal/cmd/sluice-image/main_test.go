package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildTwiceSameDigests runs `sluice-image build` twice, as two
// `make image` runs do, on the same inputs: the printed digests are equal.
func TestBuildTwiceSameDigests(t *testing.T) {
	dir := t.TempDir()
	wasm := filepath.Join(dir, "sluice.wasm")
	bin := filepath.Join(dir, "cp")
	if err := os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	var outs []string
	for i := range 2 {
		var out, errb strings.Builder
		args := []string{"build", "-out", filepath.Join(dir, "oci", string(rune('a'+i))), "-wasm", wasm,
			"-controlplane", "linux/amd64=" + bin + ",linux/arm64=" + bin, "-version", "v1.2.3", "-epoch", "1700000000"}
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		// The lines differ only in the output directory.
		outs = append(outs, strings.ReplaceAll(out.String(), "/"+string(rune('a'+i))+"/", "/x/"))
	}
	if outs[0] != outs[1] || strings.Count(outs[0], "sha256:") != 2 {
		t.Errorf("two builds printed\n%s\nand\n%s", outs[0], outs[1])
	}
}

// TestBadArguments: each mistake is refused with a message naming the flag.
func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	wasm := filepath.Join(dir, "sluice.wasm")
	if err := os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"build", "-wasm", wasm, "-controlplane", "linux/amd64=" + wasm, "-epoch", "yesterday"}, "-epoch"},
		{[]string{"build", "-wasm", wasm, "-controlplane", "amd64"}, "-controlplane"},
		{[]string{"build", "-wasm", wasm}, "-controlplane"},
		{[]string{"build", "-wasm", filepath.Join(dir, "missing.wasm"), "-controlplane", "linux/amd64=" + wasm}, "-wasm"},
		{[]string{"push", "-out", dir}, "IMAGE_REPO"},
	}
	for _, c := range cases {
		var out, errb strings.Builder
		if code := run(c.args, &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to name %s", c.args, code, errb.String(), c.want)
		}
	}
}
