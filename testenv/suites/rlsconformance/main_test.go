// Package rlsconformance sends the same RateLimitService calls to
// envoyproxy/ratelimit and to sluice's RateLimitService, each configured from
// envoyproxy/ratelimit's own test configurations (read from its module in the
// Go module cache, never copied here), each on a Redis of its own, and compares
// every answer. The peer is built from the Go module proxy at peerVersion.
package rlsconformance

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// peerModule and peerVersion are the envoyproxy/ratelimit the answers are
// compared with: the newest version the Go module proxy serves.
const (
	peerModule  = "github.com/envoyproxy/ratelimit"
	peerVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

const (
	adminToken = "rlsconformance-admin-token"
	quotaToken = "rlsconformance-quota-token"
	// readyTimeout bounds how long a process may take to serve.
	readyTimeout = 30 * time.Second
)

var (
	binDir string // sluice-controlplane, sluicectl
	repo   string // the repository root
)

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/sluicectl"},
		func(dir, root string) error {
			binDir, repo = dir, root
			return nil
		})
}

var (
	peerOnce sync.Once
	peerBin  string // the built service_cmd
	peerDir  string // the module's files in the module cache
	peerErr  error
)

// peer builds envoyproxy/ratelimit's service at peerVersion (go install from
// the module proxy) and returns the binary and the module's directory.
func peer(t *testing.T) (bin, dir string) {
	t.Helper()
	peerOnce.Do(func() {
		out := filepath.Join(binDir, "peer")
		cmd := exec.Command("go", "install", peerModule+"/src/service_cmd@"+peerVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+out, "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			peerErr = &buildError{what: "go install envoyproxy/ratelimit", out: string(b), err: err}
			return
		}
		peerBin = filepath.Join(out, "service_cmd")
		dl := exec.Command("go", "mod", "download", "-json", peerModule+"@"+peerVersion)
		dl.Env = append(os.Environ(), "GOFLAGS=")
		b, err := dl.Output()
		if err != nil {
			peerErr = &buildError{what: "go mod download envoyproxy/ratelimit", out: string(b), err: err}
			return
		}
		var info struct{ Dir string }
		if err := json.Unmarshal(b, &info); err != nil || info.Dir == "" {
			peerErr = &buildError{what: "go mod download -json", out: string(b), err: err}
			return
		}
		peerDir = info.Dir
	})
	if peerErr != nil {
		t.Fatal(peerErr)
	}
	return peerBin, peerDir
}

type buildError struct {
	what, out string
	err       error
}

func (e *buildError) Error() string { return e.what + ": " + e.err.Error() + "\n" + e.out }
