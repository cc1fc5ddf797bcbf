//go:build !wasip1

package proxywasm

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// recorder is a plugin that records every callback as "<id> <event>" and
// can be told to panic in, or return a given action from, a callback.
type recorder struct {
	events    []string
	panicIn   map[string]any // event name -> panic value
	actions   map[string]types.Action
	noHTTP    bool // NewHttpContext returns nil
	noTCP     bool
	configure bool // OnPluginStart result
}

func newRecorder() *recorder {
	return &recorder{panicIn: map[string]any{}, actions: map[string]types.Action{}, configure: true}
}

func (r *recorder) ev(id uint32, name string) {
	r.events = append(r.events, strconv.Itoa(int(id))+" "+name)
	if v, ok := r.panicIn[name]; ok {
		if _, ok := v.(indexPanic); ok {
			var s []int
			_ = s[outOfRange] // a real runtime error
		}
		panic(v)
	}
}

func (r *recorder) act(name string) types.Action { return r.actions[name] }

// VMContext
func (r *recorder) OnVMStart(size int) types.OnVMStartStatus {
	r.ev(0, "vm_start "+strconv.Itoa(size))
	return types.OnVMStartStatusOK
}
func (r *recorder) NewPluginContext(id uint32) types.PluginContext {
	r.ev(id, "new_plugin")
	return &recPlugin{r: r, id: id}
}

type recPlugin struct {
	r  *recorder
	id uint32
}

func (p *recPlugin) OnPluginStart(size int) types.OnPluginStartStatus {
	p.r.ev(p.id, "plugin_start "+strconv.Itoa(size))
	return types.OnPluginStartStatus(p.r.configure)
}
func (p *recPlugin) OnPluginDone() bool    { p.r.ev(p.id, "plugin_done"); return false }
func (p *recPlugin) OnQueueReady(q uint32) { p.r.ev(p.id, "queue_ready "+strconv.Itoa(int(q))) }
func (p *recPlugin) OnTick()               { p.r.ev(p.id, "tick") }
func (p *recPlugin) NewTcpContext(id uint32) types.TcpContext {
	p.r.ev(id, "new_tcp")
	if p.r.noTCP {
		return nil
	}
	return &recStream{r: p.r, id: id}
}
func (p *recPlugin) NewHttpContext(id uint32) types.HttpContext {
	p.r.ev(id, "new_http")
	if p.r.noHTTP {
		return nil
	}
	return &recStream{r: p.r, id: id}
}

type recStream struct {
	r  *recorder
	id uint32
}

func (s *recStream) do(name string, args ...int) types.Action {
	full := name
	for _, a := range args {
		full += " " + strconv.Itoa(a)
	}
	s.r.ev(s.id, full)
	return s.r.act(name)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *recStream) OnHttpRequestHeaders(n int, eos bool) types.Action {
	return s.do("request_headers", n, b2i(eos))
}
func (s *recStream) OnHttpRequestBody(n int, eos bool) types.Action {
	return s.do("request_body", n, b2i(eos))
}
func (s *recStream) OnHttpRequestTrailers(n int) types.Action { return s.do("request_trailers", n) }
func (s *recStream) OnHttpResponseHeaders(n int, eos bool) types.Action {
	return s.do("response_headers", n, b2i(eos))
}
func (s *recStream) OnHttpResponseBody(n int, eos bool) types.Action {
	return s.do("response_body", n, b2i(eos))
}
func (s *recStream) OnHttpResponseTrailers(n int) types.Action { return s.do("response_trailers", n) }
func (s *recStream) OnHttpStreamDone()                         { s.do("http_stream_done") }
func (s *recStream) OnNewConnection() types.Action             { return s.do("new_connection") }
func (s *recStream) OnDownstreamData(n int, eos bool) types.Action {
	return s.do("downstream_data", n, b2i(eos))
}
func (s *recStream) OnDownstreamClose(p types.PeerType) { s.do("downstream_close", int(p)) }
func (s *recStream) OnUpstreamData(n int, eos bool) types.Action {
	return s.do("upstream_data", n, b2i(eos))
}
func (s *recStream) OnUpstreamClose(p types.PeerType) { s.do("upstream_close", int(p)) }
func (s *recStream) OnStreamDone()                    { s.do("tcp_stream_done") }

func assertEvents(t *testing.T, r *recorder, want ...string) {
	t.Helper()
	if !reflect.DeepEqual(r.events, want) {
		t.Fatalf("events:\n  got  %q\n  want %q", r.events, want)
	}
	r.events = nil
}

// startRoot runs the Envoy start sequence for root context 1.
func startRoot(t *testing.T, r *recorder) {
	t.Helper()
	SetVMContext(r)
	onContextCreate(1, 0)
	if !onVMStart(1, 7) || !onConfigure(1, 9) {
		t.Fatal("start failed")
	}
	assertEvents(t, r, "1 new_plugin", "0 vm_start 7", "1 plugin_start 9")
}

func TestHTTPStreamEnvoyOrder(t *testing.T) {
	installFakeHost(t)
	r := newRecorder()
	r.actions["request_headers"] = types.ActionPause
	startRoot(t, r)

	onContextCreate(2, 1)
	if got := onRequestHeaders(2, 3, false); got != types.ActionPause {
		t.Fatalf("request headers action = %d, want pause", got)
	}
	DispatchRequestBody(2, 10, true)
	DispatchRequestTrailers(2, 1)
	onResponseHeaders(2, 4, false)
	DispatchResponseBody(2, 20, true)
	DispatchResponseTrailers(2, 2)
	// Envoy: on_log, then on_done, then on_delete (docs/ENVOY.md,
	// Lifecycle); the module exports only on_delete.
	onDelete(2)
	assertEvents(t, r,
		"2 new_http",
		"2 request_headers 3 0", "2 request_body 10 1", "2 request_trailers 1",
		"2 response_headers 4 0", "2 response_body 20 1", "2 response_trailers 2",
		"2 http_stream_done")
	if liveHTTPStreams() != 0 {
		t.Fatalf("stream not deleted: %d live", liveHTTPStreams())
	}
	// Callbacks after delete continue and reach nobody.
	if got := onRequestHeaders(2, 1, true); got != types.ActionContinue {
		t.Fatalf("action for deleted stream = %d", got)
	}
	assertEvents(t, r)
}

// TestStreamDoneExactlyOnce: the stream-done callback runs from on_delete,
// once, however often the host deletes.
func TestStreamDoneExactlyOnce(t *testing.T) {
	for _, kind := range []string{"http", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			installFakeHost(t)
			r := newRecorder()
			r.noHTTP = kind == "tcp"
			startRoot(t, r)
			onContextCreate(2, 1)
			r.events = nil
			onDelete(2)
			onDelete(2)
			want := "2 http_stream_done"
			if kind == "tcp" {
				want = "2 tcp_stream_done"
			}
			assertEvents(t, r, want)
		})
	}
}

func TestTCPStream(t *testing.T) {
	installFakeHost(t)
	r := newRecorder()
	r.noHTTP = true
	r.actions["downstream_data"] = types.ActionPause
	startRoot(t, r)
	onContextCreate(3, 1)
	DispatchNewConnection(3)
	if got := DispatchDownstreamData(3, 5, false); got != types.ActionPause {
		t.Fatalf("downstream data action = %d", got)
	}
	DispatchUpstreamData(3, 6, true)
	DispatchDownstreamConnectionClose(3, 2)
	DispatchUpstreamConnectionClose(3, 1)
	onDelete(3)
	assertEvents(t, r,
		"3 new_http", "3 new_tcp", "3 new_connection", "3 downstream_data 5 0",
		"3 upstream_data 6 1", "3 downstream_close 2", "3 upstream_close 1", "3 tcp_stream_done")
	if len(tcpStreams) != 0 {
		t.Fatal("tcp stream not deleted")
	}
}

func TestRootContextLifecycle(t *testing.T) {
	f := installFakeHost(t)
	r := newRecorder()
	startRoot(t, r)
	onTick(1)
	onQueueReady(1, 42)
	onDelete(1) // OnPluginDone's false cannot defer it: on_done is not exported
	onDelete(1)
	assertEvents(t, r, "1 tick", "1 queue_ready 42", "1 plugin_done")
	if len(roots) != 0 {
		t.Fatal("root not deleted")
	}
	// Unknown roots are ignored.
	onTick(1)
	assertEvents(t, r)
	if len(f.logs) != 0 {
		t.Fatalf("unexpected logs %q", f.logs)
	}
}

func TestConfigureFailures(t *testing.T) {
	t.Run("plugin rejects configuration", func(t *testing.T) {
		installFakeHost(t)
		r := newRecorder()
		r.configure = false
		SetVMContext(r)
		onContextCreate(1, 0)
		if onConfigure(1, 0) {
			t.Fatal("onConfigure = true, want the plugin's false")
		}
	})
	t.Run("unknown root", func(t *testing.T) {
		f := installFakeHost(t)
		SetVMContext(newRecorder())
		if onConfigure(5, 0) {
			t.Fatal("onConfigure(unknown) = true")
		}
		if len(f.logs) != 1 || !strings.Contains(f.logs[0], "unknown root context 5") {
			t.Fatalf("logs = %q", f.logs)
		}
	})
	t.Run("no VM context", func(t *testing.T) {
		f := installFakeHost(t)
		onContextCreate(1, 0)
		if onVMStart(1, 0) {
			t.Fatal("onVMStart without VMContext = true")
		}
		if len(f.logs) != 2 || !strings.HasPrefix(f.logs[0], "4 proxywasm: proxy_on_context_create: no VMContext") {
			t.Fatalf("logs = %q", f.logs)
		}
	})
}

func TestStreamWithoutContextContinues(t *testing.T) {
	installFakeHost(t)
	r := newRecorder()
	r.noHTTP, r.noTCP = true, true
	startRoot(t, r)
	onContextCreate(2, 1)
	if got := onRequestHeaders(2, 1, true); got != types.ActionContinue {
		t.Fatalf("action = %d", got)
	}
	onDelete(2)
	assertEvents(t, r, "2 new_http", "2 new_tcp")
}

// indexPanic makes the recorder fail with a runtime index error.
type indexPanic struct{}

var outOfRange = 3

type panicErr struct{}

func (panicErr) Error() string { panic("Error() panics too") }

func TestPanicsFailOpenAndAreLogged(t *testing.T) {
	tests := []struct {
		name    string
		event   string
		value   any
		run     func() bool // reports whether the result is the fail-open one
		wantLog string
	}{
		{"string in request headers", "request_headers 1 1", "boom",
			func() bool { return onRequestHeaders(2, 1, true) == types.ActionContinue },
			"4 proxywasm: recovered panic in proxy_on_request_headers: boom"},
		{"error in response body", "response_body 3 0", errors.New("bad body"),
			func() bool { return DispatchResponseBody(2, 3, false) == types.ActionContinue },
			"4 proxywasm: recovered panic in proxy_on_response_body: bad body"},
		{"runtime error in trailers", "request_trailers 0", indexPanic{},
			func() bool { return DispatchRequestTrailers(2, 0) == types.ActionContinue },
			"4 proxywasm: recovered panic in proxy_on_request_trailers: runtime error: index out of range [3] with length 0"},
		{"int value in stream done", "http_stream_done", 42,
			func() bool { onDelete(2); return true },
			"4 proxywasm: recovered panic in proxy_on_delete: panic"},
		{"panicking Error method in tick", "tick", panicErr{},
			func() bool { onTick(1); return true },
			"4 proxywasm: recovered panic in proxy_on_tick: panic"},
		{"plugin start", "plugin_start 0", "cfg",
			func() bool { return onConfigure(1, 0) },
			"4 proxywasm: recovered panic in proxy_on_configure: cfg"},
		{"plugin done", "plugin_done", "done",
			func() bool { onDelete(1); return true },
			"4 proxywasm: recovered panic in proxy_on_delete: done"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := installFakeHost(t)
			r := newRecorder()
			startRoot(t, r)
			onContextCreate(2, 1)
			r.panicIn[tc.event] = tc.value
			if !tc.run() {
				t.Fatal("result is not fail-open")
			}
			// The message is followed by the guest stack, on later lines.
			if len(f.logs) != 1 || !strings.HasPrefix(f.logs[0], tc.wantLog+"\ngoroutine ") {
				t.Fatalf("logs = %q, want [%q + stack]", f.logs, tc.wantLog)
			}
		})
	}
}

func TestPanicInStreamDoneAtDeleteStillForgetsStream(t *testing.T) {
	installFakeHost(t)
	r := newRecorder()
	startRoot(t, r)
	onContextCreate(2, 1)
	r.panicIn["http_stream_done"] = "x"
	onDelete(2)
	if liveHTTPStreams() != 0 {
		t.Fatal("stream leaked after panic in OnHttpStreamDone")
	}
}

// TestStreamsSharingATableSlot: streams whose ids fall in one slot of the
// stream table (ids streamSlots apart) are all live at once, each gets its
// own callbacks, and each is forgotten once deleted, whichever goes first.
func TestStreamsSharingATableSlot(t *testing.T) {
	for _, order := range [][]uint32{{2, 2 + streamSlots, 2 + 2*streamSlots}, {2 + 2*streamSlots, 2, 2 + streamSlots}} {
		installFakeHost(t)
		r := newRecorder()
		startRoot(t, r)
		ids := []uint32{2, 2 + streamSlots, 2 + 2*streamSlots}
		for _, id := range ids {
			onContextCreate(id, 1)
		}
		for i, id := range ids {
			onRequestHeaders(id, uint32(i), true)
		}
		for _, id := range order {
			onDelete(id)
		}
		want := []string{"2 new_http", "1026 new_http", "2050 new_http",
			"2 request_headers 0 1", "1026 request_headers 1 1", "2050 request_headers 2 1"}
		for _, id := range order {
			want = append(want, strconv.FormatUint(uint64(id), 10)+" http_stream_done")
		}
		assertEvents(t, r, want...)
		if n := liveHTTPStreams(); n != 0 {
			t.Fatalf("%d streams live after every delete", n)
		}
	}
}

func TestAStreamOfADeletedRootIsRefused(t *testing.T) {
	f := installFakeHost(t)
	r := newRecorder()
	startRoot(t, r)
	onContextCreate(2, 1) // finds root 1, which the registry then remembers
	onDelete(2)
	onDelete(1)
	assertEvents(t, r, "2 new_http", "2 http_stream_done", "1 plugin_done")
	onContextCreate(3, 1)
	assertEvents(t, r)
	if len(f.logs) != 1 || !strings.Contains(f.logs[0], "unknown root context 1 for context 3") {
		t.Fatalf("logs = %q", f.logs)
	}
	if got := onRequestHeaders(3, 1, true); got != types.ActionContinue {
		t.Fatalf("action = %d", got)
	}
	assertEvents(t, r)
}
