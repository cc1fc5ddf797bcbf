package devproxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/testenv/host"
)

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFormatTypedJSON(t *testing.T) {
	f, err := CompileFormat(mustStruct(t, map[string]any{
		"ts":      "%START_TIME%",
		"code":    "%RESPONSE_CODE%",
		"ms":      "%DURATION%",
		"path":    "%REQ_WITHOUT_QUERY(:PATH)%",
		"query":   "%CEL(request.query)%",
		"user":    "%REQ(X-USER-ID)%",
		"alt":     "%REQ(X-MISSING?USER-AGENT)%",
		"mixed":   "u=%REQ(X-MISSING)% c=%RESPONSE_CODE%",
		"limited": "%FILTER_STATE(wasm.sluice.rate_limited:PLAIN)%",
		"rule":    "%FILTER_STATE(wasm.sluice.rule:PLAIN)%",
		"ip":      "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
		"short":   "%REQ(USER-AGENT):4%",
		"env":     "%ENVIRONMENT(SLUICE_TEST_ENV)%",
		"unset":   "%ENVIRONMENT(SLUICE_TEST_UNSET)%",
		"const":   "text",
		"nested":  map[string]any{"flags": "%RESPONSE_FLAGS%"},
	}), []string{reqWOQName, celFormatter})
	if err != nil {
		t.Fatal(err)
	}
	f.env = func(k string) (string, bool) {
		return map[string]string{"SLUICE_TEST_ENV": "dev"}[k], k == "SLUICE_TEST_ENV"
	}
	line := f.Line(&LogEntry{
		Start:          time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC),
		Duration:       42 * time.Millisecond,
		RequestHeaders: host.Headers{{":path", "/api/x?a=1&b=2"}, {"user-agent", "curl/8"}},
		ResponseCode:   429,
		Remote:         "192.0.2.7:5555",
		FilterState:    map[string]string{"wasm.sluice.rate_limited": "true"},
	})
	if !strings.HasSuffix(string(line), "}\n") || strings.Count(string(line), "\n") != 1 {
		t.Fatalf("not one line: %q", line)
	}
	var got map[string]any
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"ts": "2026-01-02T03:04:05.678Z", "code": 429.0, "ms": 42.0, "path": "/api/x",
		"query": "a=1&b=2", "user": nil, "alt": "curl/8", "mixed": "u=- c=429", "limited": "true", "rule": nil,
		"ip": "192.0.2.7", "short": "curl", "env": "dev", "unset": "-", "const": "text", "nested": map[string]any{"flags": nil}}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: missing", k)
			continue
		}
		gj, _ := json.Marshal(g)
		wj, _ := json.Marshal(w)
		if string(gj) != string(wj) {
			t.Errorf("%s = %s, want %s", k, gj, wj)
		}
	}
}

func TestFormatRefuses(t *testing.T) {
	cases := []struct {
		name, value string
		formatters  []string
	}{
		{"unknown operator", "%UPSTREAM_TRANSPORT_FAILURE_REASON%", nil},
		{"typed filter state", "%FILTER_STATE(wasm.sluice.rule)%", nil},
		{"cel without extension", "%CEL(request.query)%", nil},
		{"cel expression", "%CEL(request.headers['x'])%", []string{celFormatter}},
		{"req_without_query without extension", "%REQ_WITHOUT_QUERY(:PATH)%", nil},
		{"start time format", "%START_TIME(%s)%", nil},
		{"unterminated", "%REQ(:PATH)", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CompileFormat(mustStruct(t, map[string]any{"f": c.value}), c.formatters)
			if err == nil {
				t.Fatalf("%q accepted", c.value)
			}
			t.Log(err)
		})
	}
}

func TestParseEnvoyConfig(t *testing.T) {
	c, err := LoadEnvoyConfig("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:10000" || c.RouteCluster != "upstream" || c.Clusters["control_plane"] != "127.0.0.1:8080" {
		t.Errorf("listen %s, route %s, clusters %v", c.Listen, c.RouteCluster, c.Clusters)
	}
	if c.Filter == nil || c.Filter.VMID != "sluice" || !strings.Contains(string(c.Filter.PluginConfig), `"control_plane"`) {
		t.Errorf("filter %+v", c.Filter)
	}
	if !c.UseRemoteAddress || !c.PreserveRequestID || !c.GenerateRequestID {
		t.Errorf("request ids / xff: %+v", c)
	}
	if c.NodeID != "sluice-dev" {
		t.Errorf("node id %q, want the file's node.id sluice-dev", c.NodeID)
	}
	if c.Admin != "127.0.0.1:9901" {
		t.Errorf("admin address %q, want the file's 127.0.0.1:9901", c.Admin)
	}
	for _, want := range []string{"envoy.filters.http.wasm.vm_config.runtime"} {
		found := false
		for _, ig := range c.Ignored {
			found = found || ig == want
		}
		if !found {
			t.Errorf("ignored list %q lacks %q", c.Ignored, want)
		}
	}
	cfg, err := withMember(c.Filter.PluginConfig, "token", "tok")
	if err != nil || !strings.Contains(string(cfg), `"token":"tok"`) {
		t.Errorf("withMember: %s, %v", cfg, err)
	}
}

// syncWriter collects access-log lines.
type syncWriter struct {
	mu    sync.Mutex
	lines []string
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, string(p))
	return len(p), nil
}

// TestPassThroughUpstreamErrors runs the proxy without a filter against an
// upstream that answers, one that refuses connections, and one too slow.
func TestPassThroughUpstreamErrors(t *testing.T) {
	c, err := LoadEnvoyConfig("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Seen-Request-Id", r.Header.Get("X-Request-Id"))
		w.Header().Set("X-Seen-Xff", r.Header.Get("X-Forwarded-For"))
		w.Write([]byte("hello"))
	}))
	defer up.Close()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		name, upstream, path string
		timeout              time.Duration
		status               int
		body, details, flags string
	}{
		{"ok", up.Listener.Addr().String(), "/x?q=1", 0, 200, "hello", "via_upstream", ""},
		{"connection refused", dead, "/x", 0, 503, "upstream connect error or disconnect/reset before headers. reset reason: connection failure", "upstream_reset_before_response_started{connection_failure}", "UF"},
		{"timeout", up.Listener.Addr().String(), "/x?slow=1", 200 * time.Millisecond, 504, "upstream request timeout", "response_timeout", "UT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &syncWriter{}
			p, err := New(context.Background(), Options{Config: c, Upstream: tc.upstream, AccessLog: log, UpstreamTimeout: tc.timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			srv := httptest.NewServer(p)
			defer srv.Close()
			req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
			req.Header.Set("X-Request-Id", "rid-1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if resp.StatusCode != tc.status || string(b[:n]) != tc.body {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, b[:n], tc.status, tc.body)
			}
			// Envoy appends its own local address for a loopback peer.
			if tc.status == 200 && (resp.Header.Get("X-Seen-Request-Id") != "rid-1" || resp.Header.Get("X-Seen-Xff") != p.localAddr.String()) {
				t.Errorf("upstream saw x-request-id %q, x-forwarded-for %q", resp.Header.Get("X-Seen-Request-Id"), resp.Header.Get("X-Seen-Xff"))
			}
			if len(log.lines) != 1 {
				t.Fatalf("%d log lines", len(log.lines))
			}
			var e map[string]any
			if err := json.Unmarshal([]byte(log.lines[0]), &e); err != nil {
				t.Fatal(err)
			}
			if e["status_code"] != float64(tc.status) || e["response_code_details"] != tc.details || e["request_id"] != "rid-1" || e["rate_limit"] != nil {
				t.Errorf("log line %s", log.lines[0])
			}
		})
	}
}

// TestTokensReachTheVMThroughItsEnvironment: envoy.yaml names the tokens'
// variables (token_env, quota_token_env) and copies them from the proxy's
// environment (host_env_keys), as Envoy does; a token given as an option goes
// into that variable, never into the plugin configuration.
func TestTokensReachTheVMThroughItsEnvironment(t *testing.T) {
	c, err := LoadEnvoyConfig("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := c.Filter
	if strings.Join(f.HostEnvKeys, ",") != "SLUICE_READ_TOKEN,SLUICE_QUOTA_TOKEN" {
		t.Fatalf("host_env_keys %q", f.HostEnvKeys)
	}
	if controlPlaneMember(f.PluginConfig, "token_env") != "SLUICE_READ_TOKEN" || controlPlaneMember(f.PluginConfig, "quota_token_env") != "SLUICE_QUOTA_TOKEN" ||
		strings.Contains(string(f.PluginConfig), `"token"`) || strings.Contains(string(f.PluginConfig), `"quota_token"`) {
		t.Fatalf("the plugin configuration carries a token or names no variable:\n%s", f.PluginConfig)
	}
	proc := map[string]string{"SLUICE_READ_TOKEN": "r", "HOME": "/root"}
	env := vmEnv(f, func(k string) (string, bool) { v, ok := proc[k]; return v, ok })
	if len(env) != 1 || env["SLUICE_READ_TOKEN"] != "r" {
		t.Fatalf("the VM's environment %v: want only the host_env_keys set in the proxy's", env)
	}
	p, err := New(context.Background(), Options{Config: c, Wasm: filterWasm(t), ReadToken: "from-a-flag", QuotaToken: "q",
		Getenv: func(string) (string, bool) { return "", false }, Clusters: map[string]string{"control_plane": "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, l := range p.Host().Logs() {
		if strings.Contains(l.Message, "written in the plugin configuration") {
			t.Errorf("the filter warned of an inline token: %s", l.Message)
		}
	}
}
