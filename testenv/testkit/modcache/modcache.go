// Package modcache finds another project's files in the Go module cache:
// go mod download fetches a module at a version from the Go module proxy (the
// module is never a dependency of sluice's), and its files are read where the
// cache keeps them, never copied into this repository. Tests read upstream's
// own configurations and manifests this way.
package modcache

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"
)

// Dir downloads module at version (if the cache lacks it) and returns the
// directory holding its files. A failed download fails t, with go's output.
func Dir(t testing.TB, module, version string) string {
	t.Helper()
	dir, err := Download(module, version)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Download is Dir for callers without a testing.TB (a TestMain, a sync.Once).
func Download(module, version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	b, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(b, &info); err != nil || jerr != nil || info.Dir == "" {
		return "", &Error{Module: module + "@" + version, Out: string(b) + info.Error, Err: err}
	}
	return info.Dir, nil
}

// Error is a download that failed.
type Error struct {
	Module, Out string
	Err         error
}

func (e *Error) Error() string {
	msg := "no directory"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	return "go mod download " + e.Module + ": " + msg + "\n" + e.Out
}
