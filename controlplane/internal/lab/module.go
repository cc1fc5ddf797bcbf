package lab

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// embedded holds the filter module when sluicectl was built by make, which
// copies build/sluice.wasm to embedded/sluice.wasm first.
//
//go:embed embedded
var embedded embed.FS

// Module returns the filter module to run and where it came from: the file
// path when not empty; else the module embedded at build time; else
// sluice.wasm beside the running executable (build/sluicectl beside
// build/sluice.wasm). Errors: the file cannot be read, or there is no module
// anywhere (the message says how to get one).
func Module(path string) ([]byte, string, error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", fmt.Errorf("--wasm: %w", err)
		}
		return b, path, nil
	}
	if b, err := embedded.ReadFile("embedded/sluice.wasm"); err == nil && len(b) > 0 {
		return b, "embedded", nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sluice.wasm")
		if b, err := os.ReadFile(p); err == nil {
			return b, p, nil
		}
	}
	return nil, "", errors.New("this sluicectl carries no filter module (it was not built by make build): pass --wasm build/sluice.wasm")
}

// CacheCompiled keeps the machine code wazero compiles the module to in the
// user's cache directory (sluice/wazero under os.UserCacheDir), so the next
// run skips compiling it. Without a cache directory it does nothing.
func CacheCompiled() {
	dir, err := os.UserCacheDir()
	if err != nil {
		return
	}
	_ = host.UseCompilationCacheDir(filepath.Join(dir, "sluice", "wazero"))
}
