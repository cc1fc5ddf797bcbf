package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisproc"
	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
)

// Built once per test binary by TestMain, into a temporary directory.
var (
	binDir  string // sluice-controlplane, sluice-devproxy, sluice-echo, sluice-run, sluicectl, sluice.wasm
	wasmBin []byte
	repo    string // the repository root
)

// How long a started process may take to come up: the control plane and
// the upstream to answer 200, the dev proxy (its VMs first) to listen.
const (
	readyTimeout  = 20 * time.Second
	listenTimeout = 60 * time.Second
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	var err error
	if repo, err = filepath.Abs("../.."); err != nil {
		return 1, err
	}
	if binDir, err = os.MkdirTemp("", "sluice-e2e"); err != nil {
		return 1, err
	}
	err = proctest.BuildAll(repo,
		proctest.Build{Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
			Args: []string{"-trimpath", "-buildmode=c-shared", "-o", filepath.Join(binDir, "sluice.wasm"), "./filter"}},
		proctest.Build{Args: []string{"-trimpath", "-o", filepath.Join(binDir, "sluice-controlplane"), "./controlplane/cmd/sluice-controlplane"}},
		proctest.Build{Args: []string{"-trimpath", "-o", filepath.Join(binDir, "sluice-devproxy"), "./testenv/cmd/sluice-devproxy"}},
		proctest.Build{Args: []string{"-trimpath", "-o", filepath.Join(binDir, "sluice-echo"), "./testenv/cmd/sluice-echo"}},
		proctest.Build{Args: []string{"-trimpath", "-o", filepath.Join(binDir, "sluice-run"), "./testenv/cmd/sluice-run"}},
		proctest.Build{Args: []string{"-trimpath", "-o", filepath.Join(binDir, "sluicectl"), "./controlplane/cmd/sluicectl"}},
	)
	if err != nil {
		return 1, err
	}
	if wasmBin, err = os.ReadFile(filepath.Join(binDir, "sluice.wasm")); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// startProc starts a process of the stack in the repository root, where
// the relative paths in its arguments (envoy/envoy.yaml) resolve.
func startProc(t testing.TB, name, bin string, args, env []string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, proctest.Spec{Name: name, Bin: bin, Args: args, Env: env, Dir: repo})
}

// startRedis runs redis-server on addr ("127.0.0.1:port") with an
// append-only file in dir (fsync always), so a restart keeps what was
// acknowledged. Without redis-server on PATH the test fails.
func startRedis(t testing.TB, addr, dir string) *redisproc.Server {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return redisproc.Start(t, redisproc.Options{AppendOnly: true, Port: p, Dir: dir})
}
