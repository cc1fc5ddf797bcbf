package rlssource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

const apiYAML = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"

// configMapDir lays dir out as a Kubernetes ConfigMap volume: the file in a
// "..<timestamp>" directory, "..data" linking to it, the name linking
// through "..data".
func configMapDir(t *testing.T, dir, name, body string) {
	t.Helper()
	write(t, filepath.Join(dir, "..2026_12_02_00_00_00.1", name), body)
	if err := os.Symlink("..2026_12_02_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// TestAConfigMapVolumeLoadsTwiceUnlessDotFilesAreIgnored: as in
// envoyproxy/ratelimit, the volume's "..<timestamp>" copy is read too unless
// RUNTIME_IGNOREDOTFILES is set, and one domain in two files is refused.
func TestAConfigMapVolumeLoadsTwiceUnlessDotFilesAreIgnored(t *testing.T) {
	dir := t.TempDir()
	configMapDir(t, dir, "config.yaml", apiYAML)
	s := NewFiles(FilesOptions{Dir: dir})
	if err := s.Load(); err == nil || !strings.Contains(err.Error(), "api") || s.Loaded() {
		t.Fatalf("without ignoring dot files: %v (loaded %v), want the domain refused as named twice", err, s.Loaded())
	}
	s = NewFiles(FilesOptions{Dir: dir, IgnoreDotFiles: true})
	if err := s.Load(); err != nil {
		t.Fatal(err)
	}
	if got := s.Files(); len(got) != 1 || got[0] != "config.yaml" {
		t.Errorf("files %v, want [config.yaml]", got)
	}
	if !strings.Contains(s.Dump(), "api.user: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false") {
		t.Errorf("dump:\n%s", s.Dump())
	}
}

// TestWatchingTheRootReadsOnlyTheAppDirectory: with RUNTIME_WATCH_ROOT the
// files read are those under the application directory, named with "." for
// "/" as goruntime names its keys.
func TestWatchingTheRootReadsOnlyTheAppDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config", "a", "api.yaml"), apiYAML)
	write(t, filepath.Join(dir, "other", "x.yaml"), "not: [a config")
	write(t, filepath.Join(dir, "configuration.yaml"), "not: [a config")
	s := NewFiles(FilesOptions{Dir: dir, AppDir: "config"})
	if err := s.Load(); err != nil {
		t.Fatal(err)
	}
	if got := s.Files(); len(got) != 1 || got[0] != "config.a.api.yaml" {
		t.Errorf("files %v, want [config.a.api.yaml]", got)
	}
}

// TestABrokenChangeKeepsTheLastGoodPolicyAndIsCounted: the generation moves
// only when what is served changes; a broken file is counted once, however
// often the same bytes are read again.
func TestABrokenChangeKeepsTheLastGoodPolicyAndIsCounted(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "api.yaml"), apiYAML)
	reg := prometheus.NewRegistry()
	s := NewFiles(FilesOptions{Dir: dir, Registry: reg})
	if err := s.Load(); err != nil {
		t.Fatal(err)
	}
	gen, rec := s.Generation(), s.List()[0]
	if err := s.Load(); err != nil || s.Generation() != gen {
		t.Fatalf("the same files again: %v, generation %d → %d", err, gen, s.Generation())
	}
	write(t, filepath.Join(dir, "api.yaml"), strings.Replace(apiYAML, "requests_per_unit: 3", "requests_per_unit: three", 1))
	for range 3 {
		if err := s.Load(); err == nil && s.Generation() != gen {
			t.Fatal("a broken file was served")
		}
	}
	if got, ok := s.Get("ratelimit"); !ok || got.Version != rec.Version || string(got.Doc) != string(rec.Doc) {
		t.Errorf("after a broken file: %+v, want the last good version %d", got, rec.Version)
	}
	if n := testutil.ToFloat64(s.Served.loads.WithLabelValues("error")); n != 1 {
		t.Errorf("errors counted %v, want 1 (the same bytes are reported once)", n)
	}
	write(t, filepath.Join(dir, "api.yaml"), strings.Replace(apiYAML, "requests_per_unit: 3", "requests_per_unit: 4", 1))
	if err := s.Load(); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("ratelimit"); got.Version != rec.Version+1 || s.Generation() == gen {
		t.Errorf("a good change after a broken one: version %d generation %d", got.Version, s.Generation())
	}
	if _, ok := s.Get("other"); ok {
		t.Error("a policy the files do not name is served")
	}
}
