// Package ratelimitpeer builds envoyproxy/ratelimit, the service sluice's
// RateLimitService is compared with, from the Go module proxy (never a
// dependency of sluice's module: go install fetches and builds it apart), and
// finds its module's own files (test configurations, examples) in the module
// cache.
package ratelimitpeer

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/modcache"
)

// Module and Version are the envoyproxy/ratelimit compared with: the newest
// version the Go module proxy serves.
const (
	Module  = "github.com/envoyproxy/ratelimit"
	Version = "v1.4.1-0.20260122083618-3fb702589d36"
)

var (
	once   sync.Once
	bin    string
	modDir string
	err    error
)

// Build builds envoyproxy/ratelimit's service (src/service_cmd) at Version
// into dir, once per process (later calls return the first build), and
// returns the binary and the module's directory in the module cache. A
// failed build fails t, with go's output.
func Build(t testing.TB, dir string) (binary, moduleDir string) {
	t.Helper()
	once.Do(func() {
		out := filepath.Join(dir, "ratelimitpeer")
		cmd := exec.Command("go", "install", Module+"/src/service_cmd@"+Version)
		cmd.Env = append(os.Environ(), "GOBIN="+out, "GOFLAGS=")
		if b, e := cmd.CombinedOutput(); e != nil {
			err = &modcache.Error{Module: Module + "@" + Version + " (go install)", Out: string(b), Err: e}
			return
		}
		bin = filepath.Join(out, "service_cmd")
		modDir, err = modcache.Download(Module, Version)
	})
	if err != nil {
		t.Fatal(err)
	}
	return bin, modDir
}
