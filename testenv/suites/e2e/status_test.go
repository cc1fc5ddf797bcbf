package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// sluicectl runs the built sluicectl against the control plane at cpAddr
// and returns its stdout and exit code.
func sluicectl(t *testing.T, cpAddr string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), args...)
	cmd.Dir = repo
	cmd.Env = []string{"SLUICE_SERVER=http://" + cpAddr, "SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken}
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("sluicectl %v: %v", args, err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

type envoyRow struct {
	Node    string `json:"node"`
	Status  string `json:"status"`
	Version uint64 `json:"version"`
}

// envoyStatus runs sluicectl status POLICY -o json and returns the rows by
// node and the exit code.
func envoyStatus(t *testing.T, cpAddr, policy string) (map[string]envoyRow, uint64, int) {
	t.Helper()
	out, code := sluicectl(t, cpAddr, "status", policy, "-o", "json")
	var st struct {
		Version uint64     `json:"version"`
		Envoys  []envoyRow `json:"envoys"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -o json: %v in %q", err, out)
	}
	m := map[string]envoyRow{}
	for _, e := range st.Envoys {
		m[e.Node] = e
	}
	return m, st.Version, code
}

// TestStatusOfTwoProxies: two dev proxies (real processes, the real .wasm)
// on one control plane report their Envoy through the filter's long poll;
// sluicectl status shows both SYNCED at the current version, both again at
// the new version after a PUT, and a stopped proxy as STALE once the
// control plane's --envoy-stale-after has passed.
func TestStatusOfTwoProxies(t *testing.T) {
	cpAddr := proctest.FreeAddr(t)
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken}
	cp := startProc(t, "control plane", filepath.Join(binDir, "sluice-controlplane"), []string{
		"--listen", cpAddr, "--log-level", "warn", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--envoy-stale-after", "2s"}, tokens)
	proctest.AwaitHTTP(t, "http://"+cpAddr+"/readyz", readyTimeout, cp)
	if out, code := sluicectl(t, cpAddr, "apply", "-f", "examples/default-policy.json"); code != 0 {
		t.Fatalf("apply: exit %d\n%s", code, out)
	}
	up := proctest.FreeAddr(t)
	echo := startProc(t, "upstream", filepath.Join(binDir, "sluice-echo"), []string{"--listen", up}, nil)
	proctest.AwaitHTTP(t, "http://"+up+"/", readyTimeout, echo)
	proxies := map[string]*proctest.Proc{}
	for _, node := range []string{"proxy-a", "proxy-b"} {
		addr := proctest.FreeAddr(t)
		p := startProc(t, node, filepath.Join(binDir, "sluice-devproxy"), []string{
			"--config", "envoy/envoy.yaml", "--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", addr,
			"--upstream", up, "--cluster", "control_plane=" + cpAddr, "--access-log", filepath.Join(t.TempDir(), "access.log"),
			"--workers", "1", "--log-level", "warn", "--service-node", node}, tokens)
		proctest.AwaitListening(t, addr, listenTimeout, p)
		proxies[node] = p
	}

	// synced waits until sluicectl status exits 0 with both proxies SYNCED
	// at version v.
	synced := func(v uint64) {
		t.Helper()
		var rows map[string]envoyRow
		var cur uint64
		var code int
		if !proctest.WaitFor(60*time.Second, func() bool {
			rows, cur, code = envoyStatus(t, cpAddr, "default")
			return code == 0 && cur == v && len(rows) == 2 &&
				rows["proxy-a"] == (envoyRow{"proxy-a", "SYNCED", v}) && rows["proxy-b"] == (envoyRow{"proxy-b", "SYNCED", v})
		}) {
			t.Fatalf("not both SYNCED at v%d within 60s: exit %d, current v%d, %+v", v, code, cur, rows)
		}
	}
	synced(1)
	table, _ := sluicectl(t, cpAddr, "status")
	t.Logf("sluicectl status:\n%s", table)

	// A change: both follow.
	req := `{"id":"api-per-user","match":{"path_prefix":"/api/"},"key":["user|client_ip"],"algorithm":"token_bucket","limit":` + strconv.Itoa(50) + `,"window":"1m"}`
	s := &stack{t: t, cpAddr: cpAddr}
	if v := s.putOK("/v1/policies/default/rules/api-per-user", req); v != 2 {
		t.Fatalf("PUT made version %d, want 2", v)
	}
	synced(2)

	// proxy-b stops: STALE after --envoy-stale-after; proxy-a stays SYNCED.
	proxies["proxy-b"].Kill()
	var rows map[string]envoyRow
	var code int
	if !proctest.WaitFor(60*time.Second, func() bool {
		rows, _, code = envoyStatus(t, cpAddr, "default")
		return code == 1 && rows["proxy-b"].Status == "STALE" && rows["proxy-a"].Status == "SYNCED"
	}) {
		t.Fatalf("the stopped proxy is not STALE within 60s: exit %d, %+v", code, rows)
	}
	table, _ = sluicectl(t, cpAddr, "status", "default")
	t.Logf("after stopping proxy-b:\n%s", table)
}
