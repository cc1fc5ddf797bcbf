package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/tetratelabs/wazero"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// inputs are the filter and the linux/amd64 control plane, built by
// TestMain exactly as `make image` builds them.
var inputs Inputs

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ociimage-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		wasm := filepath.Join(dir, "sluice.wasm")
		cp := filepath.Join(dir, "sluice-controlplane")
		for _, b := range []struct {
			env  []string
			args []string
		}{
			{[]string{"GOOS=wasip1", "GOARCH=wasm"}, []string{"-buildmode=c-shared", "-trimpath", "-o", wasm, "./filter"}},
			{[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, []string{"-trimpath", "-ldflags=-s -w", "-o", cp, "./controlplane/cmd/sluice-controlplane"}},
		} {
			cmd := exec.Command("go", append([]string{"build"}, b.args...)...)
			cmd.Dir = "../.."
			cmd.Env = append(os.Environ(), b.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build %v: %v\n%s", b.args, err, out)
				return 1
			}
		}
		var err error
		if inputs.Wasm, err = os.ReadFile(wasm); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bin, err := os.ReadFile(cp)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		inputs.ControlPlane = []Binary{{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Data: bin}}
		return m.Run()
	}()
	os.Exit(code)
}

var testMeta = Meta{Version: "v0.0.0-test", Source: "https://github.com/sluice-proxy/sluice",
	Revision: "0123456789abcdef0123456789abcdef01234567", Created: time.Unix(1767225600, 0).UTC()}

// pushed builds both layouts, starts an in-process registry on
// 127.0.0.1 and pushes them there as `make push` does.
func pushed(t *testing.T) (repo string, out []Pushed) {
	t.Helper()
	dir := t.TempDir()
	if _, err := Build(dir, inputs, testMeta); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	repo = u.Host + "/sluice"
	out, err = Push(dir, repo, testMeta.Version)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Name != WasmName || out[1].Name != ControlPlaneName {
		t.Fatalf("pushed %+v", out)
	}
	return repo, out
}

// TestWasmImagePullsAsIstioAndEnvoyGatewayFetchItAndLimits pushes the
// images, then fetches the Wasm image the way Istio's
// pkg/wasm/imagefetcher.go (and Envoy Gateway's copy of it) does: the
// manifest by tag, an OCI manifest, the last layer of media type
// application/vnd.oci.image.layer.v1.tar+gzip, gunzipped, plugin.wasm out
// of its tar. The module must be byte for byte the built one, the layer
// blob must hash to its digest, and the pulled bytes must run in the
// testenv host and limit a request.
func TestWasmImagePullsAsIstioAndEnvoyGatewayFetchItAndLimits(t *testing.T) {
	repo, out := pushed(t)
	ref, err := name.ParseReference(repo + "/" + WasmName + ":" + testMeta.Version)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != out[0].Digest {
		t.Errorf("tag resolves to %s, push printed %s", desc.Digest, out[0].Digest)
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	img, err := desc.Image()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s", m.Config.MediaType)
	}
	if m.Annotations[VariantAnnotation] != VariantCompat {
		t.Errorf("annotation %s=%q, want %q", VariantAnnotation, m.Annotations[VariantAnnotation], VariantCompat)
	}
	if m.Annotations[labelVersion] != testMeta.Version || m.Annotations[labelSource] != testMeta.Source {
		t.Errorf("annotations %v", m.Annotations)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("layers %+v, want one %s", m.Layers, types.OCILayer)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[len(layers)-1].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	blob, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(blob); "sha256:"+hex.EncodeToString(sum[:]) != m.Layers[0].Digest.String() {
		t.Errorf("layer blob hashes to %x, manifest says %s", sum, m.Layers[0].Digest)
	}
	module := pluginWasm(t, blob)
	if !bytes.Equal(module, inputs.Wasm) {
		t.Fatalf("pulled plugin.wasm (%d bytes) differs from build/sluice.wasm (%d bytes)", len(module), len(inputs.Wasm))
	}

	// The pulled module, with a static policy of one request per user per
	// minute: the second request of a user is refused.
	ctx := context.Background()
	h, err := host.New(ctx, host.Config{Wasm: module, VMID: "sluice", PluginName: "sluice", Workers: 1,
		Clock: host.NewVirtualClock(testMeta.Created), LogLevel: host.LogWarn,
		PluginConfig: []byte(`{"env":"prod","policy":{"policy":"image","version":1,"identity":{"user_header":"x-user-id"},
			"rules":[{"id":"per-user","key":["user"],"algorithm":"fixed_window","limit":1,"window":"1m"}]}}`)})
	if err != nil {
		t.Fatalf("the pulled module did not start: %v", err)
	}
	defer h.Close()
	var statuses []int
	for range 2 {
		resp, err := h.Worker(0).Do(ctx, host.Request{Path: "/api", Headers: host.Headers{{"x-user-id", "u1"}}})
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.Status)
		if len(statuses) == 2 && resp.LocalReply == nil {
			t.Error("the second request was not answered by the filter")
		}
	}
	if !slices.Equal(statuses, []int{200, 429}) {
		t.Errorf("statuses %v, want [200 429]", statuses)
	}
}

// pluginWasm is extractWasmPluginBinary of Istio's fetcher: gunzip, then
// the first tar entry whose base name is plugin.wasm.
func pluginWasm(t *testing.T, blob []byte) []byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the layer", WasmFile)
		} else if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(h.Name) == WasmFile {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestControlPlaneImageIsMinimalAndNonRoot pulls the control plane's
// linux/amd64 image from the registry: a non-root numeric user, the binary
// as entrypoint, port 8080 exposed, the OCI labels, and a filesystem that
// is that one static x86-64 executable (no shell, no libc).
func TestControlPlaneImageIsMinimalAndNonRoot(t *testing.T) {
	repo, out := pushed(t)
	ref, err := name.ParseReference(repo + "/" + ControlPlaneName + "@" + out[1].Digest.String())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var img v1.Image
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == "amd64" {
			if img, err = idx.Image(d.Digest); err != nil {
				t.Fatal(err)
			}
		}
	}
	if img == nil {
		t.Fatalf("no linux/amd64 image in %+v", im.Manifests)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	uid, _, _ := strings.Cut(cf.Config.User, ":")
	if uid == "" || strings.Trim(uid, "0123456789") != "" || strings.Trim(uid, "0") == "" {
		t.Errorf("user %q: want a numeric non-root uid", cf.Config.User)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{Entrypoint}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	for _, p := range []string{"8080/tcp", "8081/tcp", "6070/tcp"} { // 8081 and 6070: envoyproxy/ratelimit's gRPC and debug
		if _, ok := cf.Config.ExposedPorts[p]; !ok {
			t.Errorf("exposed ports %v lack %s", cf.Config.ExposedPorts, p)
		}
	}
	if !slices.Contains(cf.Config.Env, "SLUICE_LISTEN=0.0.0.0:8080") {
		t.Errorf("env %v", cf.Config.Env)
	}
	for _, k := range []string{labelSource, labelVersion, labelRevision} {
		if cf.Config.Labels[k] == "" {
			t.Errorf("label %s missing: %v", k, cf.Config.Labels)
		}
	}
	if cf.Config.Labels[labelLicenses] != "Apache-2.0" {
		t.Errorf("label %s: %q, want Apache-2.0 (the LICENSE file)", labelLicenses, cf.Config.Labels[labelLicenses])
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config platform %s/%s", cf.OS, cf.Architecture)
	}

	files := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
		if h.Name == RateLimitCommand[1:] && (h.Typeflag != tar.TypeSymlink || h.Linkname != Entrypoint) {
			t.Errorf("%s: type %c link %q, want a symbolic link to %s", h.Name, h.Typeflag, h.Linkname, Entrypoint)
		}
		if base := filepath.Base(h.Name); base == "sh" || base == "bash" || base == "busybox" {
			t.Errorf("the image holds a shell: %s", h.Name)
		}
		if h.Name == Entrypoint[1:] && h.Mode&0o111 == 0 {
			t.Errorf("%s mode %o is not executable", h.Name, h.Mode)
		}
	}
	if want := []string{RateLimitCommand[1:], Entrypoint[1:]}; !slices.Equal(slices.Sorted(maps.Keys(files)), want) {
		t.Errorf("files %v, want only %v", slices.Sorted(maps.Keys(files)), want)
	}
	bin := files[Entrypoint[1:]]
	if !bytes.Equal(bin, inputs.ControlPlane[0].Data) {
		t.Fatal("the image's binary is not the linux/amd64 build")
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	if f.Machine != elf.EM_X86_64 {
		t.Errorf("ELF machine %v", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a dynamic loader (PT_INTERP): not static, it cannot run in an image without libc")
		}
	}
}

// TestBuildIsReproducible builds both layouts twice from the same inputs:
// the digests, index.json and every blob are identical; another Created
// time gives other digests (the time is really in the images).
func TestBuildIsReproducible(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	da, err := Build(a, inputs, testMeta)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Build(b, inputs, testMeta)
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Fatalf("digests differ: %+v and %+v", da, db)
	}
	t.Logf("sluice-wasm %s, sluice-controlplane %s", da.Wasm, da.ControlPlane)
	for _, n := range []string{WasmName, ControlPlaneName} {
		fa, fb := treeOf(t, filepath.Join(a, n)), treeOf(t, filepath.Join(b, n))
		if len(fa) < 4 || !sameTree(fa, fb) {
			t.Errorf("%s: the two layouts differ (%d and %d files)", n, len(fa), len(fb))
		}
	}
	later := testMeta
	later.Created = later.Created.Add(time.Second)
	dl, err := Build(t.TempDir(), inputs, later)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Wasm == da.Wasm || dl.ControlPlane == da.ControlPlane {
		t.Error("another build time gave the same digests")
	}
}

func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestPushNeedsARepository: without IMAGE_REPO the push names it.
func TestPushNeedsARepository(t *testing.T) {
	if _, err := Push(t.TempDir(), "", "v1"); err == nil || !strings.Contains(err.Error(), "IMAGE_REPO") {
		t.Errorf("err %v", err)
	}
}

// TestWasmRefusesANonModule: Build refuses a file that is not Wasm.
func TestWasmRefusesANonModule(t *testing.T) {
	if _, err := Wasm([]byte("#!/bin/sh\necho"), testMeta); err == nil {
		t.Error("accepted a shell script as the module")
	}
}

// BenchmarkWasmCompile compiles the filter module with wazero's compiler
// (what testenv/host does once per host) and reports the module's size:
//
//	go test -run '^$' -bench WasmCompile ./envoy/ociimage
func BenchmarkWasmCompile(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
		if _, err := r.CompileModule(ctx, inputs.Wasm); err != nil {
			b.Fatal(err)
		}
		r.Close(ctx)
	}
	b.ReportMetric(float64(len(inputs.Wasm)), "wasm-bytes")
}
