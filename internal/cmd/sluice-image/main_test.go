package main

import (
	"os"
	"path/filepath"
	"regexp"
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

// TestManifestsPinTheBuiltImages: `sluice-image manifests` writes the repository's
// manifests with both images at the digests just built, under the given
// repository, the tokens filled in from the environment, and no placeholder left.
func TestManifestsPinTheBuiltImages(t *testing.T) {
	dir := t.TempDir()
	wasm, bin := filepath.Join(dir, "sluice.wasm"), filepath.Join(dir, "cp")
	if err := os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "oci")
	var built, errb strings.Builder
	if code := run([]string{"build", "-out", oci, "-wasm", wasm, "-controlplane", "linux/amd64=" + bin, "-epoch", "1"}, &built, &errb); code != 0 {
		t.Fatalf("build: %s", errb.String())
	}
	digests := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindAllString(built.String(), -1)
	if len(digests) != 2 {
		t.Fatalf("build printed %q", built.String())
	}
	dest := filepath.Join(dir, "manifests")
	rt, qt := "rt-"+strings.Repeat("1", 61), "qt-"+strings.Repeat("4", 61) // 64 characters, as openssl rand -hex 32
	env := map[string]string{"SLUICE_READ_TOKEN": rt, "SLUICE_QUOTA_TOKEN": qt}
	var out strings.Builder
	errb.Reset()
	if err := manifests(&out, &errb, oci, "reg.test/team/", "../../../envoy", dest, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	var all, secrets string
	files, _ := filepath.Glob(filepath.Join(dest, "*", "*.yaml"))
	if len(files) < 6 {
		t.Fatalf("wrote only %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all += string(b)
		// No token value outside a Secret: not in a WasmPlugin, an
		// EnvoyExtensionPolicy or a ConfigMap, where whoever reads those reads it.
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if regexp.MustCompile(`(?m)^kind: Secret$`).MatchString(doc) {
				secrets += doc
				continue
			}
			for _, tok := range []string{rt, qt} {
				if strings.Contains(doc, tok) {
					t.Errorf("%s: a token value outside a Secret:\n%s", f, doc)
				}
			}
		}
	}
	for _, want := range []string{"reg.test/team/sluice-wasm@" + digests[0], "reg.test/team/sluice-controlplane@" + digests[1]} {
		if !strings.Contains(all, want) {
			t.Errorf("the manifests lack %q", want)
		}
	}
	for _, want := range []string{"read-token: " + rt, "quota-token: " + qt} {
		if !strings.Contains(secrets, want) {
			t.Errorf("no Secret holds %q", want)
		}
	}
	if strings.Contains(all, "@sha256:0000000000") || strings.Contains(all, "change-me-") || errb.Len() > 0 {
		t.Errorf("a placeholder is left (stderr %q)", errb.String())
	}

	// Tokens unset, placeholders or short: refused, naming each variable,
	// nothing written.
	for name, env := range map[string]map[string]string{
		"unset":       {},
		"placeholder": {"SLUICE_READ_TOKEN": "change-me-read-token", "SLUICE_QUOTA_TOKEN": qt},
		"short":       {"SLUICE_READ_TOKEN": rt, "SLUICE_QUOTA_TOKEN": "qt-456"},
	} {
		to := filepath.Join(t.TempDir(), "m")
		err := manifests(&out, &errb, oci, "reg.test/team", "../../../envoy", to, func(k string) string { return env[k] })
		if err == nil {
			t.Errorf("%s tokens: accepted", name)
			continue
		}
		for _, v := range []string{"SLUICE_READ_TOKEN", "SLUICE_QUOTA_TOKEN"} {
			if bad := env[v] == "" || strings.HasPrefix(env[v], "change-me") || len(env[v]) < 32; bad != strings.Contains(err.Error(), v) {
				t.Errorf("%s tokens: %v (naming %s: %t, want %t)", name, err, v, !bad, bad)
			}
		}
		if _, serr := os.Stat(to); serr == nil {
			t.Errorf("%s tokens: manifests written to %s", name, to)
		}
	}
}
