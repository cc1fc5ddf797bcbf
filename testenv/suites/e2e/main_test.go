package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
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
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./testenv/cmd/sluice-devproxy",
		"./testenv/cmd/sluice-echo", "./testenv/cmd/sluice-run", "./controlplane/cmd/sluicectl"},
		func(dir, root string) (err error) {
			binDir, repo = dir, root
			wasmBin, err = os.ReadFile(filepath.Join(dir, "sluice.wasm"))
			return err
		})
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
