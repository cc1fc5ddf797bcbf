package realenvoy

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// Built once per test binary by TestMain, into a temporary directory.
var (
	binDir string // sluice-controlplane, sluice-devproxy, sluice-echo, sluicectl, sluice.wasm
	repo   string // the repository root
)

const (
	adminToken = "realenvoy-admin-token"
	readToken  = "realenvoy-read-token"
	quotaToken = "realenvoy-quota-token"
	// readyTimeout bounds how long the control plane and the upstream may
	// take to answer 200.
	readyTimeout = 20 * time.Second
)

// tokens is the environment every process of a stack gets: the control plane
// reads all three, Envoy hands the read and quota tokens to the filter's VM
// (vm_config.environment_variables.host_env_keys in envoy/envoy.yaml).
var tokens = []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken,
	"SLUICE_QUOTA_TOKEN=" + quotaToken, "SLUICE_ENV=realenvoy"}

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./testenv/cmd/sluice-devproxy",
		"./testenv/cmd/sluice-echo", "./controlplane/cmd/sluicectl"},
		func(dir, root string) error {
			binDir, repo = dir, root
			return nil
		})
}

// startProc starts a process in the repository root.
func startProc(t testing.TB, name, bin string, args, env []string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, proctest.Spec{Name: name, Bin: filepath.Join(binDir, bin), Args: args, Env: env, Dir: repo})
}

// controlPlane is a running sluice-controlplane.
type controlPlane struct {
	*proctest.Proc
	addr string // its REST address
}

// startControlPlane runs the control plane on a free loopback port with the
// arguments extra (a store: --data-dir or --redis-url) and waits for /readyz.
func startControlPlane(t testing.TB, name string, extra ...string) *controlPlane {
	t.Helper()
	addr := proctest.FreeAddr(t)
	p := startProc(t, name, "sluice-controlplane", append([]string{"--listen", addr, "--log-level", "warn"}, extra...), tokens)
	proctest.AwaitHTTP(t, "http://"+addr+"/readyz", readyTimeout, p)
	return &controlPlane{Proc: p, addr: addr}
}

// startUpstream runs the demo echo server and returns its address.
func startUpstream(t testing.TB) string {
	t.Helper()
	addr := proctest.FreeAddr(t)
	p := startProc(t, "upstream", "sluice-echo", []string{"--listen", addr}, nil)
	proctest.AwaitHTTP(t, "http://"+addr+"/", readyTimeout, p)
	return addr
}

// fresh is an HTTP client that opens a new connection per request, so that
// Envoy's listener spreads the requests over its workers.
var fresh = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
