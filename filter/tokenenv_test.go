package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestTokensAreReadFromTheVMsEnvironment: with token_env and quota_token_env the
// filter reads its tokens from the VM's environment (Envoy's
// vm_config.environment_variables, here the host's Env, served through WASI
// environ_get) and sends them as it would inline ones; an inline token still
// works but is warned about; a named variable that is not set is warned about
// and the calls go without a token; one holding no valid token fails the
// configuration.
func TestTokensAreReadFromTheVMsEnvironment(t *testing.T) {
	bin := buildWasmTB(t)
	auth := make(chan string, 1024)
	cp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case auth <- r.Header.Get("Authorization"):
		default:
		}
		http.Error(w, "no policy here", http.StatusNotFound)
	}))
	defer cp.Close()
	start := func(section string, env map[string]string) (*host.Host, error) {
		h, err := host.New(context.Background(), host.Config{Wasm: bin, VMID: "sluice", PluginName: "sluice",
			PluginConfig: []byte(`{"control_plane":{"cluster":"cp","policy":"p","wait":"1s","timeout":"2s"` + section + `}}`),
			Workers:      1, Clock: host.SystemClock, Env: env, LogLevel: host.LogInfo,
			Clusters: map[string]string{"cp": strings.TrimPrefix(cp.URL, "http://")}})
		if err == nil {
			t.Cleanup(func() { h.Close() })
		}
		return h, err
	}
	polled := func(want string) {
		t.Helper()
		var seen []string
		timeout := time.After(10 * time.Second)
		for {
			select {
			case a := <-auth:
				if a == want {
					return
				}
				seen = append(seen, a)
			case <-timeout:
				t.Fatalf("no poll carried %q within 10 s; saw %q", want, seen)
			}
		}
	}
	warned := func(h *host.Host) bool {
		for _, l := range h.Logs() {
			if strings.Contains(l.Message, "control_plane.token is written in the plugin configuration") {
				return true
			}
		}
		return false
	}

	h, err := start(`,"token_env":"SLUICE_READ_TOKEN","quota_token_env":"SLUICE_QUOTA_TOKEN"`,
		map[string]string{"SLUICE_READ_TOKEN": "from-the-environment", "SLUICE_QUOTA_TOKEN": "q"})
	if err != nil {
		t.Fatal(err)
	}
	polled("Bearer from-the-environment")
	if warned(h) {
		t.Error("a token from the environment was warned about")
	}

	h, err = start(`,"token":"inline-token"`, nil)
	if err != nil {
		t.Fatal(err)
	}
	polled("Bearer inline-token")
	if !warned(h) {
		t.Error("an inline token was not warned about")
	}

	// An unset variable is warned about and the calls go without a token (a
	// refused configuration would make Envoy reject the whole listener).
	h, err = start(`,"token_env":"SLUICE_READ_TOKEN"`, map[string]string{"OTHER": "x"})
	if err != nil {
		t.Fatalf("an unset token variable: %v", err)
	}
	polled("")
	unset := false
	for _, l := range h.Logs() {
		unset = unset || strings.Contains(l.Message, "control_plane.token_env: the VM's environment has no SLUICE_READ_TOKEN")
	}
	if !unset {
		t.Error("an unset token variable was not warned about")
	}

	// A variable holding what cannot be a token fails the configuration.
	_, err = start(`,"token_env":"SLUICE_READ_TOKEN"`, map[string]string{"SLUICE_READ_TOKEN": "two words"})
	if !errors.Is(err, host.ErrConfigureFailed) {
		t.Fatalf("a token with a space: %v, want the configuration refused", err)
	}
}
