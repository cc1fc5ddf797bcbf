package host_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

func TestHeadersReadAndWritten(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	resp := do(t, h.Worker(0), host.Request{
		Path: "/orig",
		Headers: host.Headers{
			{"x-op", "headers"}, {"x-a", "1"}, {"X-B", "2"}, {"x-c", "3"}, {"x-c", "4"},
			{"x-replace", "old"}, {"x-replace", "old2"}, {"x-remove", "gone"}, {"x-request-id", "rid"},
		},
	})
	if resp.Upstream == nil {
		t.Fatal("request did not reach the upstream")
	}
	want := host.Headers{
		{":authority", "localhost"}, {":method", "GET"}, {":scheme", "http"}, {":path", "/rewritten"},
		{"x-op", "headers"}, {"x-a", "1"}, {"x-b", "2"}, {"x-c", "3"}, {"x-c", "4"},
		{"x-request-id", "rid"}, {"x-forwarded-proto", "http"},
		{"x-seen", "1|2|3"}, {"x-missing-err", "proxywasm: not found (status 1)"},
		{"x-count", "14/14/true"}, {"x-size", "150"}, {"x-upper", "lowered"}, {"x-replace", "new"},
	}
	if !slices.Equal(resp.Upstream.Headers, want) {
		t.Errorf("upstream headers\n got %q\nwant %q", resp.Upstream.Headers, want)
	}
	if got := resp.Headers.Get("x-abi-resp"); got != "headers" {
		t.Errorf("response header x-abi-resp = %q, want %q", got, "headers")
	}
}

func TestLocalReply(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	upstreamCalled := false
	resp := do(t, h.Worker(0), host.Request{Headers: op("reply"), Upstream: func(host.UpstreamRequest) host.UpstreamResponse {
		upstreamCalled = true
		return host.UpstreamResponse{}
	}})
	if upstreamCalled || resp.Upstream != nil {
		t.Error("upstream was called despite the local reply")
	}
	wantHeaders := host.Headers{{"retry-after", "7"}, {"x-custom", "a"}, {"x-custom", "b"}, {"content-length", "6"}, {"content-type", "text/plain"}}
	if resp.Status != 429 || string(resp.Body) != "denied" || !slices.Equal(resp.Headers, wantHeaders) {
		t.Errorf("got %d %q %q, want 429 %q %q", resp.Status, resp.Body, resp.Headers, "denied", wantHeaders)
	}
	lr := resp.LocalReply
	// grpc_status 42 is outside 0..16: none.
	if lr == nil || lr.Details != "rate_limited_by_abi" || lr.GRPCStatus != nil {
		t.Errorf("local reply = %+v, want details rate_limited_by_abi and no grpc status", lr)
	}
	if !hasLog(resp.Logs, "reply err=nil") {
		t.Errorf("logs %v lack %q", resp.Logs, "reply err=nil")
	}
}

func hasLog(logs []host.LogEntry, msg string) bool {
	for _, l := range logs {
		if l.Message == msg {
			return true
		}
	}
	return false
}

func TestPropertiesAndFilterState(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true, RootID: "abi_root"})
	resp := do(t, h.Worker(0), host.Request{
		Method: "POST", Path: "/a/b?x=1", Authority: "api.example", Scheme: "https",
		Headers: host.Headers{{"x-op", "property"}, {"x-value", "limited"}, {"x-request-id", "req-7"}, {"user-agent", "ua/1"}},
		Info:    host.StreamInfo{SourceAddress: "10.1.2.3:4567"},
		Upstream: func(host.UpstreamRequest) host.UpstreamResponse {
			return host.UpstreamResponse{Status: 201}
		},
	})
	nf := "/proxywasm: not found (status 1)"
	want := map[string]string{
		"x-readback":                     "limited/nil",
		"x-prop-source.address":          "10.1.2.3:4567/nil",
		"x-prop-request.path":            "/a/b?x=1/nil",
		"x-prop-request.url_path":        "/a/b/nil",
		"x-prop-request.method":          "POST/nil",
		"x-prop-request.id":              "req-7/nil",
		"x-prop-request.host":            "api.example/nil",
		"x-prop-request.scheme":          "https/nil",
		"x-prop-request.useragent":       "ua/1/nil",
		"x-prop-request.headers.x-value": "limited/nil",
		"x-prop-plugin_name":             "abi_plugin/nil",
		"x-prop-plugin_root_id":          "abi_root/nil",
		"x-prop-plugin_vm_id":            "sluice/nil",
		"x-prop-response.code":           nf,
		"x-prop-no_such_property":        nf,
		"x-prop-connection-id-len":       "8",
	}
	for k, v := range want {
		if got := resp.Upstream.Headers.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := resp.Upstream.Headers.Get("x-prop-headers-bytes"); got == "0" || got == "" {
		t.Errorf("request.headers map is empty (%q)", got)
	}
	wantState := map[string]string{"wasm.abi_decision": "limited", "wasm.abi_status": "201/8/nil"}
	if !mapsEqual(resp.FilterState, wantState) {
		t.Errorf("filter state = %q, want %q", resp.FilterState, wantState)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestSharedDataCASConflictBetweenVMs(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true, Workers: 2})
	w0, w1 := h.Worker(0), h.Worker(1)
	result := func(w *host.Worker, name string, kv ...string) string {
		t.Helper()
		return do(t, w, host.Request{Headers: op(name, kv...)}).Upstream.Headers.Get("x-result")
	}
	steps := []struct {
		w    *host.Worker
		op   string
		kv   []string
		want string
	}{
		{w0, "cas-get", []string{"x-key", "k"}, "/proxywasm: not found (status 1)"},
		{w0, "cas-set", []string{"x-key", "k", "x-value", "v0"}, "nil"}, // new key: created whatever the cas
		{w0, "cas-get", []string{"x-key", "k"}, "v0/nil"},
		{w1, "cas-get", []string{"x-key", "k"}, "v0/nil"},
		{w0, "cas-set", []string{"x-key", "k", "x-value", "v1"}, "nil"},
		{w1, "cas-set", []string{"x-key", "k", "x-value", "v2"}, "proxywasm: cas mismatch (status 8)"},
		{w1, "cas-get", []string{"x-key", "k"}, "v1/nil"},
		{w1, "cas-set", []string{"x-key", "k", "x-value", "v2"}, "nil"},
	}
	for i, s := range steps {
		if got := result(s.w, s.op, s.kv...); got != s.want {
			t.Fatalf("step %d: worker %d %s = %q, want %q", i, s.w.Index(), s.op, got, s.want)
		}
	}
	val, cas, ok := h.SharedData("k")
	// Four successful sets on a fresh host: the global cas counter is 3.
	if string(val) != "v2" || cas != 3 || !ok {
		t.Errorf("SharedData(k) = %q, %d, %v; want v2, 3, true", val, cas, ok)
	}
}

func TestTickFollowsVirtualClock(t *testing.T) {
	h, clock := newHost(t, host.Config{PluginConfig: []byte("tick=100")})
	ticks := func() string { v, _, _ := h.SharedData("ticks"); return string(v) }
	clock.Advance(99 * time.Millisecond)
	if got := ticks(); got != "" {
		t.Fatalf("after 99ms ticks = %q, want none", got)
	}
	clock.Advance(time.Millisecond)
	if got := ticks(); got != "1" {
		t.Fatalf("after 100ms ticks = %q, want 1 (the canary's tick must not fire)", got)
	}
	clock.Advance(250 * time.Millisecond)
	if got := ticks(); got != "3" {
		t.Fatalf("after 350ms ticks = %q, want 3", got)
	}
	want := "tick 3 at " + strconv.FormatInt(epoch.Add(300*time.Millisecond).UnixNano(), 10)
	if !hasLog(h.Logs(), want) {
		t.Errorf("no log %q", want)
	}
}

func TestTimeFollowsVirtualClock(t *testing.T) {
	h, clock := newHost(t, host.Config{NoCanary: true})
	clock.Advance(90 * time.Second)
	resp := do(t, h.Worker(0), host.Request{Headers: op("time")})
	if got, want := resp.Upstream.Headers.Get("x-host-ns"), strconv.FormatInt(epoch.Add(90*time.Second).UnixNano(), 10); got != want {
		t.Errorf("proxy_get_current_time_nanoseconds = %s, want %s", got, want)
	}
}

func TestHTTPCallout(t *testing.T) {
	var gotReq *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotReq = r
		w.Header().Set("X-Cp", "yes")
		w.WriteHeader(202)
		w.Write([]byte("policy-v1"))
	}))
	defer srv.Close()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(200)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer cut.Close()
	refused := proctest.FreeAddr(t) // nothing listens there
	h, _ := newHost(t, host.Config{NoCanary: true, Clusters: map[string]string{
		"control_plane": srv.Listener.Addr().String(),
		"cut":           cut.Listener.Addr().String(),
		"refused":       refused,
	}})
	tests := []struct {
		name string
		kv   []string
		want string
	}{
		{"success", []string{"x-cluster", "control_plane"}, "202 yes policy-v1 nil 0"},
		{"unknown cluster", []string{"x-cluster", "nope"}, "dispatch: proxywasm: bad argument (status 2)"},
		{"missing :authority", []string{"x-cluster", "control_plane", "x-drop", ":authority"}, "dispatch: proxywasm: bad argument (status 2)"},
		{"missing :path", []string{"x-cluster", "control_plane", "x-drop", ":path"}, "dispatch: proxywasm: bad argument (status 2)"},
		{"missing :method", []string{"x-cluster", "control_plane", "x-drop", ":method"}, "dispatch: proxywasm: bad argument (status 2)"},
		{"reset after headers", []string{"x-cluster", "cut"}, "failed 11 reset nil"},
		{"connection refused", []string{"x-cluster", "refused"}, "503  upstream connect error or disconnect/reset before headers. reset reason: connection failure nil 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, h.Worker(0), host.Request{Headers: op("callout", tc.kv...)})
			if resp.Upstream == nil {
				t.Fatal("the paused request never resumed to the upstream")
			}
			if got := resp.Upstream.Headers.Get("x-callout"); got != tc.want {
				t.Errorf("x-callout = %q, want %q", got, tc.want)
			}
		})
	}
	if gotReq == nil || gotReq.Host != "cp.internal" || gotReq.URL.String() != "/cp?q=1" || gotReq.Header.Get("X-From") != "abi" {
		t.Errorf("control plane saw %+v", gotReq)
	}
}

func TestPanicInCallbackKeepsVM(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	resp := do(t, h.Worker(0), host.Request{Headers: op("panic")})
	if resp.Upstream == nil {
		t.Error("a recovered panic must fail open")
	}
	found := false
	for _, l := range resp.Logs {
		found = found || (l.Level == host.LogError && strings.Contains(l.Message, "abi boom"))
	}
	if !found {
		t.Errorf("panic not logged: %v", resp.Logs)
	}
	resp = do(t, h.Worker(0), host.Request{Headers: op("headers", "x-a", "a")})
	if got := resp.Upstream.Headers.Get("x-seen"); got != "a||" {
		t.Errorf("next request: x-seen = %q, want %q", got, "a||")
	}
}

func TestHostcallDuringInitializeTraps(t *testing.T) {
	_, err := host.New(context.Background(), host.Config{Wasm: initcallWasm, Clock: host.NewVirtualClock(epoch)})
	var trap *host.TrapError
	if !errors.As(err, &trap) || trap.Call != "_initialize" || !strings.Contains(err.Error(), "restricted_callback: env.proxy_get_shared_data") {
		t.Fatalf("New = %v, want a trap in _initialize naming env.proxy_get_shared_data", err)
	}
	if !errors.Is(err, host.ErrVMFailed) {
		t.Errorf("errors.Is(err, ErrVMFailed) = false")
	}
}

func TestConfigureFailureFailsStart(t *testing.T) {
	_, err := host.New(context.Background(), host.Config{Wasm: abiWasm, PluginName: "limiter", PluginConfig: []byte("configure=fail")})
	if !errors.Is(err, host.ErrConfigureFailed) || !strings.Contains(err.Error(), `"limiter"`) || !strings.Contains(err.Error(), "canary") {
		t.Fatalf("New = %v, want ErrConfigureFailed in the canary naming the plugin", err)
	}
}

func TestModuleWithoutABIMarkerIsRejected(t *testing.T) {
	// The smallest valid module: magic and version only.
	_, err := host.New(context.Background(), host.Config{Wasm: []byte("\x00asm\x01\x00\x00\x00")})
	if !errors.Is(err, host.ErrNoABIVersion) {
		t.Fatalf("New = %v, want ErrNoABIVersion", err)
	}
}

func TestLifecycleOrder(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true, Trace: true})
	resp := do(t, h.Worker(0), host.Request{Headers: op("none")})
	var callbacks []string
	for _, c := range resp.Trace {
		if strings.HasPrefix(c, "proxy_on_") && !strings.HasPrefix(c, "proxy_on_memory_allocate") {
			callbacks = append(callbacks, c)
		}
	}
	want := []string{
		"proxy_on_context_create(2, 1)",
		"proxy_on_request_headers(2, 7, 1)",
		"proxy_on_response_headers(2, 1, 1)",
		"proxy_on_log(2)", // Envoy: on_log before on_done (the spec differs)
		"proxy_on_done(2)",
		"proxy_on_delete(2)",
	}
	if !slices.Equal(callbacks, want) {
		t.Errorf("callbacks\n got %q\nwant %q", callbacks, want)
	}
}

func TestMetrics(t *testing.T) {
	h, _ := newHost(t, host.Config{Workers: 2})
	resp := do(t, h.Worker(1), host.Request{Headers: op("metric")})
	if got := resp.Upstream.Headers.Get("x-requests"); got != "1/nil" {
		t.Errorf("counter read back = %q, want 1/nil", got)
	}
	do(t, h.Worker(0), host.Request{})
	want := map[string]host.Metric{
		"abi_requests":         {Type: host.MetricCounter, Value: 2}, // aggregated over workers
		"wasmcustom.abi_gauge": {Type: host.MetricGauge, Value: 42},
		"abi_hist":             {Type: host.MetricHistogram, Value: 2, Samples: []uint64{7, 9}},
	}
	for name, w := range want {
		got, ok := h.Metric(name)
		if !ok || got.Type != w.Type || got.Value != w.Value || !slices.Equal(got.Samples, w.Samples) {
			t.Errorf("Metric(%q) = %+v, %v; want %+v", name, got, ok, w)
		}
	}
}

func TestSharedQueue(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	resp := do(t, h.Worker(0), host.Request{Headers: op("enqueue", "x-value", "hello")})
	if got := resp.Upstream.Headers.Get("x-result"); got != "nil/proxywasm: not found (status 1)" {
		t.Errorf("enqueue/resolve = %q", got)
	}
	// on_queue_ready is posted to the registrant's loop (Envoy: the registrant's
	// dispatcher, cpp-host SharedQueue::enqueue), with no order against the
	// stream's own phases: wait for it.
	want := "hello then proxywasm: empty (status 7)"
	var v []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if v, _, _ = h.SharedData("queue_last"); string(v) == want {
			return
		}
	}
	t.Errorf("queue_last = %q after 10s, want %q", v, want)
}

func TestBodies(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	resp := do(t, h.Worker(0), host.Request{Method: "POST", Headers: op("body"), Body: []byte("abc"),
		Upstream: func(r host.UpstreamRequest) host.UpstreamResponse {
			return host.UpstreamResponse{Body: append([]byte("echo:"), r.Body...)}
		}})
	if string(resp.Upstream.Body) != "ABC" || string(resp.Body) != "ECHO:ABC" {
		t.Errorf("upstream got %q, client got %q; want ABC, ECHO:ABC", resp.Upstream.Body, resp.Body)
	}
	// Step-wise: a body callback that pauses buffers until end of stream.
	s, err := h.Worker(0).NewStream(host.StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	steps := []struct {
		run  func() (host.Status, error)
		want host.Status
	}{
		{func() (host.Status, error) { return s.RequestHeaders(ctx, op("pause-body"), false) }, host.Continue},
		{func() (host.Status, error) { return s.RequestBody(ctx, []byte("ab"), false) }, host.Paused},
		{func() (host.Status, error) { return s.RequestBody(ctx, []byte("cd"), true) }, host.Continue},
	}
	for i, st := range steps {
		if got, err := st.run(); err != nil || got != st.want {
			t.Fatalf("step %d = %v, %v; want %v", i, got, err, st.want)
		}
	}
	if got := string(s.ForwardedRequestBody()); got != "ABCD" {
		t.Errorf("forwarded body = %q, want ABCD", got)
	}
	if err := s.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	// The module exports the body callbacks (it imports streamexports), so
	// each chunk entered it: one request body for the first request, two
	// for the step-wise one; one response body for the first.
	got := h.CallbackCalls()
	if got["proxy_on_request_body"] != 3 || got["proxy_on_response_body"] != 1 {
		t.Errorf("body callbacks entered: %v; want 3 request and 1 response", got)
	}
}

func TestCloseStream(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	resp := do(t, h.Worker(0), host.Request{Headers: op("close")})
	if !resp.Reset || resp.Upstream != nil {
		t.Errorf("got %+v, want a reset stream", resp)
	}
}

func TestLogLevelHonoured(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true, LogLevel: host.LogInfo})
	resp := do(t, h.Worker(0), host.Request{Headers: op("log")})
	var got []string
	for _, l := range resp.Logs {
		got = append(got, l.Level.String()+":"+l.Message)
	}
	want := []string{"info:info line", "warn:warn line", "info:stream done 2"}
	if !slices.Equal(got, want) {
		t.Errorf("logs = %q, want %q", got, want)
	}
}
