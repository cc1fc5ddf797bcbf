//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockRunDir takes the run directory for this run: an exclusive flock(2) on
// dir/lock, held (with the file open) until the process exits, which the kernel
// releases even after kill -9. A directory another run holds is refused with the
// way out, before anything in it (logs, the store, the tokens) is touched.
func lockRunDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, "lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			owner := "another make run"
			if b, err := os.ReadFile(name); err == nil && strings.TrimSpace(string(b)) != "" {
				owner += " (pid " + strings.TrimSpace(string(b)) + ")"
			}
			return nil, fmt.Errorf("%s is in use by %s: give this one its own directory and ports, e.g. `make run %s`",
				dir, owner, freeRunArgs(dir))
		}
		return nil, fmt.Errorf("locking %s: %w", name, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}
