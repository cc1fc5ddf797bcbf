package bootstrap

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestRewriteBootstrapChangesOnlyAddressesAndFiles(t *testing.T) {
	src, err := os.ReadFile("../../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Apply(src, Rewrite{Listeners: []string{"127.0.0.1:1001"}, Admin: "127.0.0.1:1002",
		Clusters:  map[string]string{"upstream": "127.0.0.1:1003", "control_plane": "127.0.0.1:1004"},
		AccessLog: "/tmp/x/access.log", Files: map[string]string{"build/sluice.wasm": "/tmp/x/sluice.wasm"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"port_value: 1001", "port_value: 1002", "port_value: 1003", "port_value: 1004",
		"path: /tmp/x/access.log", "filename: /tmp/x/sluice.wasm", "envoy.filters.http.wasm", "FAIL_OPEN", "%FILTER_STATE(wasm.sluice:PLAIN)%"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rewritten bootstrap lacks %q", want)
		}
	}
	for _, gone := range []string{"port_value: 10000", "port_value: 8080", "port_value: 9901", "/dev/stdout"} {
		if strings.Contains(string(out), gone) {
			t.Errorf("rewritten bootstrap still has %q", gone)
		}
	}
	var a, b map[string]any
	if yaml.Unmarshal(src, &a) != nil || yaml.Unmarshal(out, &b) != nil {
		t.Fatal("unparsable")
	}
	if len(a) != len(b) {
		t.Errorf("top-level members %d, want %d", len(b), len(a))
	}
}

func TestRewriteBootstrapRefusesWhatTheFileLacks(t *testing.T) {
	src, err := os.ReadFile("../../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := func() Rewrite {
		return Rewrite{Listeners: []string{"127.0.0.1:1"}, Admin: "127.0.0.1:2"}
	}
	cases := map[string]func(*Rewrite){
		"unknown cluster": func(r *Rewrite) { r.Clusters = map[string]string{"nope": "127.0.0.1:3"} },
		"unknown file":    func(r *Rewrite) { r.Files = map[string]string{"/nope.wasm": "/x"} },
		"two listeners":   func(r *Rewrite) { r.Listeners = append(r.Listeners, "127.0.0.1:4") },
		"bad address":     func(r *Rewrite) { r.Admin = "nowhere" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := base()
			mutate(&r)
			if _, err := Apply(src, r); err == nil {
				t.Fatal("accepted")
			} else {
				t.Log(err)
			}
		})
	}
}

func TestApplyAddsAnAdminEndpointWhereThereIsNone(t *testing.T) {
	src := []byte("static_resources:\n  listeners:\n  - address: {socket_address: {address: 0.0.0.0, port_value: 80}}\n")
	out, err := Apply(src, Rewrite{Listeners: []string{"127.0.0.1:1001"}, Admin: "127.0.0.1:1002"})
	if err != nil {
		t.Fatal(err)
	}
	var b map[string]any
	if err := yaml.Unmarshal(out, &b); err != nil {
		t.Fatal(err)
	}
	if got := dig(b, "admin", "address", "socket_address", "port_value"); got != 1002 {
		t.Fatalf("admin port %v, want 1002\n%s", got, out)
	}
}
