package realenvoy

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// TestATrappedVMFailsOpenAfterTheRequestThatTrapped: envoy/envoy.yaml's
// failure_policy FAIL_OPEN, with a module whose request callback dies of a
// fatal Go runtime error (no recover catches it: the VM traps). In Envoy the
// request whose callback trapped is answered 503 with details wasm_fail_stream;
// every later request on that worker bypasses the failed VM and reaches the
// upstream. The dev proxy must do the same.
func TestATrappedVMFailsOpenAfterTheRequestThatTrapped(t *testing.T) {
	abi := filepath.Join(t.TempDir(), "abiplugin.wasm")
	if err := proctest.BuildAll(repo, proctest.Build{Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
		Args: []string{"-buildmode=c-shared", "-o", abi, "./testenv/testdata/abiplugin"}}); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t)
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			p := startProxy(t, kind, proxySpec{name: "trap", config: "envoy/envoy.yaml", upstream: up, workers: 1,
				clusters: map[string]string{"control_plane": proctest.FreeAddr(t)},
				files:    map[string]string{"build/sluice.wasm": abi}})
			if r := p.do(t, "GET", "/before", "X-Request-Id", "before"); r.status != http.StatusOK {
				t.Fatalf("before the trap: %d, want 200", r.status)
			}
			r := p.do(t, "GET", "/trap", "X-Op", "fatal", "X-Request-Id", "trap")
			if r.status != http.StatusServiceUnavailable {
				t.Errorf("the request that trapped: %d %q, want 503", r.status, r.body)
			}
			if d := p.logOf(t, "trap")["response_code_details"]; d != "wasm_fail_stream" {
				t.Errorf("the request that trapped: response_code_details %v, want wasm_fail_stream", d)
			}
			for _, id := range []string{"after-1", "after-2", "after-3"} {
				if r := p.do(t, "GET", "/after", "X-Request-Id", id); r.status != http.StatusOK {
					t.Errorf("%s, after the trap: %d %q, want 200 (fail open)", id, r.status, r.body)
				}
				if d := p.logOf(t, id)["response_code_details"]; d != "via_upstream" {
					t.Errorf("%s: response_code_details %v, want via_upstream", id, d)
				}
			}
		})
	}
}
