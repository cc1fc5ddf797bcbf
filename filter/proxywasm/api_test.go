//go:build !wasip1

package proxywasm

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"testing"
	"unsafe"

	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func TestStatusError(t *testing.T) {
	tests := []struct {
		code status
		want error
	}{
		{1, ErrNotFound},
		{2, ErrBadArgument},
		{3, ErrSerializationFailure},
		{4, ErrParseFailure},
		{6, ErrInvalidMemoryAccess},
		{7, ErrEmpty},
		{8, ErrCasMismatch},
		{10, ErrInternalFailure},
		{11, ErrBrokenConnection},
		{12, ErrUnimplemented},
	}
	seen := map[error]bool{}
	for _, tc := range tests {
		got := statusError(tc.code)
		if got != tc.want {
			t.Errorf("statusError(%d) = %v, want %v", tc.code, got, tc.want)
		}
		if seen[got] {
			t.Errorf("statusError(%d) = %v reused", tc.code, got)
		}
		seen[got] = true
	}
	if err := statusError(0); err != nil {
		t.Errorf("statusError(0) = %v", err)
	}
	for _, code := range []status{5, 9, 13, 0xFFFFFFFF} {
		err := statusError(code)
		var se *StatusError
		if !errors.As(err, &se) || se.Code != uint32(code) {
			t.Errorf("statusError(%d) = %v, want *StatusError{%d}", code, err, code)
		}
	}
	if got, want := statusError(9).Error(), "proxywasm: host returned status 9"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestNoHostIsUnimplemented(t *testing.T) {
	if _, err := GetHttpRequestHeader("x"); !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("without a host: %v, want ErrUnimplemented", err)
	}
}

func TestAllocate(t *testing.T) {
	t.Cleanup(func() { lastAlloc = nil })
	p := allocate(0) // must not panic
	if p == nil {
		t.Fatal("allocate(0) returned nil")
	}
	p = allocate(5)
	addr := uint32(uintptr(p))
	got, st := takeAlloc(statusOK, addr, 5)
	if st != statusOK || len(got) != 5 || unsafe.Pointer(&got[0]) != p {
		t.Fatalf("takeAlloc = %v, %d; want the 5-byte allocation", got, st)
	}
	if lastAlloc != nil {
		t.Fatal("lastAlloc not released")
	}

	tests := []struct {
		name    string
		alloc   uint32 // 0: no allocation
		st      status
		ptr     func(p unsafe.Pointer) uint32
		size    uint32
		wantLen int
		wantSt  status
	}{
		{"empty result", 0, statusOK, func(unsafe.Pointer) uint32 { return 0 }, 0, 0, statusOK},
		{"host error", 4, statusNotFound, func(p unsafe.Pointer) uint32 { return uint32(uintptr(p)) }, 4, 0, statusNotFound},
		{"shorter than allocated", 8, statusOK, func(p unsafe.Pointer) uint32 { return uint32(uintptr(p)) }, 3, 3, statusOK},
		{"foreign pointer", 4, statusOK, func(p unsafe.Pointer) uint32 { return uint32(uintptr(p)) + 1 }, 4, 0, statusInvalidMemoryAccess},
		{"no allocation", 0, statusOK, func(unsafe.Pointer) uint32 { return 64 }, 4, 0, statusInvalidMemoryAccess},
		{"size beyond allocation", 4, statusOK, func(p unsafe.Pointer) uint32 { return uint32(uintptr(p)) }, 5, 0, statusInvalidMemoryAccess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p unsafe.Pointer
			if tc.alloc > 0 {
				p = allocate(tc.alloc)
			}
			got, st := takeAlloc(tc.st, tc.ptr(p), tc.size)
			if st != tc.wantSt || len(got) != tc.wantLen {
				t.Fatalf("takeAlloc = len %d, %d; want len %d, %d", len(got), st, tc.wantLen, tc.wantSt)
			}
			if lastAlloc != nil {
				t.Fatal("lastAlloc not released")
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	f := installFakeHost(t)
	req := [][2]string{{":method", "GET"}, {":path", "/a"}, {"x-key", "k1"}, {"x-key", "k2"}}
	f.maps[MapTypeHttpRequestHeaders] = pairs.Encode(req)

	got, err := GetHttpRequestHeaders()
	if err != nil || !reflect.DeepEqual(got, req) {
		t.Fatalf("GetHttpRequestHeaders = %q, %v", got, err)
	}
	v, err := GetHttpRequestHeader("x-key")
	if err != nil || v != "k1" {
		t.Fatalf("GetHttpRequestHeader = %q, %v", v, err)
	}
	if _, err := GetHttpRequestHeader("missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing header: %v", err)
	}
	if _, err := GetHttpResponseHeaders(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing map: %v", err)
	}
	f.maps[MapTypeHttpCallResponseHeaders] = []byte{1, 0, 0, 0}
	if _, err := GetHttpCallResponseHeaders(); !errors.Is(err, pairs.ErrTruncated) {
		t.Fatalf("malformed map: %v", err)
	}
	f.maps[MapTypeHttpCallResponseTrailers] = nil
	if got, err := GetHttpCallResponseTrailers(); err != nil || got != nil {
		t.Fatalf("empty map = %q, %v", got, err)
	}

	resp := [][2]string{{"x-ratelimit-limit", "10"}, {"retry-after", "1"}}
	if err := ReplaceHttpResponseHeaders(resp); err != nil {
		t.Fatal(err)
	}
	if got, _ := pairs.Decode(f.maps[MapTypeHttpResponseHeaders]); !reflect.DeepEqual(got, resp) {
		t.Fatalf("set map = %q", got)
	}
	for _, err := range []error{
		AddHttpRequestHeader("a", "1"), ReplaceHttpRequestHeader("b", "2"), RemoveHttpRequestHeader("c"),
		AddHttpResponseTrailer("d", "3"), ReplaceHttpRequestTrailer("e", "4"), RemoveHttpResponseHeader("f"),
		ReplaceHttpRequestTrailers(nil),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"get_header_map_pairs 0", "get_header_map_value 0 x-key", "get_header_map_value 0 missing",
		"get_header_map_pairs 2", "get_header_map_pairs 6", "get_header_map_pairs 7",
		"set_header_map_pairs 2",
		"add_header_map_value 0 a 1", "replace_header_map_value 0 b 2", "remove_header_map_value 0 c",
		"add_header_map_value 3 d 3", "replace_header_map_value 1 e 4", "remove_header_map_value 2 f",
		"set_header_map_pairs 1",
	}
	if !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace:\n  got  %q\n  want %q", f.trace, want)
	}
}

// fixedHost answers header reads from preallocated buffers, as a real host
// hands over a fresh buffer without the guest allocating.
type fixedHost struct {
	unimplementedHost
	value, pairs []byte
}

func (h *fixedHost) getHeaderMapValue(MapType, string) ([]byte, status) { return h.value, statusOK }
func (h *fixedHost) getHeaderMapPairs(MapType) ([]byte, status)         { return h.pairs, statusOK }

func TestHeaderReadsDoNotAllocate(t *testing.T) {
	h := &fixedHost{value: []byte("abc"), pairs: pairs.Encode([][2]string{{"a", "1"}, {"b", "2"}})}
	host = h
	t.Cleanup(func() { host = unimplementedHost{}; EndHostScratch() })
	readValue := func() {
		if v, err := GetHttpRequestHeader("x-api-key"); err != nil || v != "abc" {
			t.Fatal(v, err)
		}
	}
	readMap := func() {
		if ps, err := GetHttpRequestHeaders(); err != nil || len(ps) != 2 || ps[1] != [2]string{"b", "2"} {
			t.Fatal(ps, err)
		}
	}
	// Outside a scope every result is a fresh buffer.
	if n := testing.AllocsPerRun(100, readValue); n != 1 {
		t.Errorf("GetHttpRequestHeader outside a scope: %v allocations, want 1 (the result buffer)", n)
	}
	if n := testing.AllocsPerRun(100, readMap); n != 2 {
		t.Errorf("GetHttpRequestHeaders outside a scope: %v allocations, want 2 (buffer and result slice)", n)
	}
	// Inside a scope the arena serves them: ten reads per scope.
	scoped := func(read func()) func() {
		return func() {
			BeginHostScratch()
			for range 10 {
				read()
			}
			EndHostScratch()
		}
	}
	scoped(readValue)() // warm the slab
	if n := testing.AllocsPerRun(100, scoped(readValue)); n != 0 {
		t.Errorf("10 × GetHttpRequestHeader in a scope: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, scoped(readMap)); n != 10 {
		t.Errorf("10 × GetHttpRequestHeaders in a scope: %v allocations, want 10 (the result slices)", n)
	}
}

func TestBodiesAndConfiguration(t *testing.T) {
	f := installFakeHost(t)
	f.buffers[BufferTypeHttpRequestBody] = []byte("hello world")
	f.buffers[BufferTypePluginConfiguration] = []byte(`{"a":1}`)

	if b, err := GetHttpRequestBody(6, 100); err != nil || string(b) != "world" {
		t.Fatalf("GetHttpRequestBody = %q, %v", b, err)
	}
	if _, err := GetHttpRequestBody(-1, 1); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("negative start: %v", err)
	}
	if b, err := GetPluginConfiguration(); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("GetPluginConfiguration = %q, %v", b, err)
	}
	if _, err := GetVMConfiguration(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetVMConfiguration without buffer: %v", err)
	}
	if b, err := GetHttpResponseBody(0, 10); !errors.Is(err, ErrNotFound) || b != nil {
		t.Fatalf("GetHttpResponseBody = %q, %v", b, err)
	}
	_ = SetHttpRequestBody([]byte("new"))
	_ = AppendHttpResponseBody([]byte("tail"))
	_ = PrependHttpRequestBody([]byte("head"))
	want := []string{
		"get_buffer_bytes 0 6 100",
		"get_buffer_bytes 7 0 2147483647",
		"get_buffer_bytes 6 0 2147483647",
		"get_buffer_bytes 1 0 10",
		"set_buffer_bytes 0 0 2147483647 new",
		"set_buffer_bytes 1 2147483647 0 tail",
		"set_buffer_bytes 0 0 0 head",
	}
	if !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace:\n  got  %q\n  want %q", f.trace, want)
	}
}

func TestBufferRange(t *testing.T) {
	tests := []struct {
		start, maxSize int
		wantStart      uint32
		wantMax        uint32
		wantErr        error
	}{
		{0, 0, 0, 0, nil},
		{6, 100, 6, 100, nil},
		{0, math.MaxInt32, 0, math.MaxInt32, nil},
		{10, math.MaxInt, 10, math.MaxUint32 - 10, nil},
		{math.MaxUint32, 5, math.MaxUint32, 0, nil},
		{-1, 1, 0, 0, ErrBadArgument},
		{0, -1, 0, 0, ErrBadArgument},
		{math.MaxUint32 + 1, 0, 0, 0, ErrBadArgument},
	}
	for _, tc := range tests {
		s, m, err := bufferRange(tc.start, tc.maxSize)
		if s != tc.wantStart || m != tc.wantMax || err != tc.wantErr {
			t.Errorf("bufferRange(%d, %d) = %d, %d, %v; want %d, %d, %v",
				tc.start, tc.maxSize, s, m, err, tc.wantStart, tc.wantMax, tc.wantErr)
		}
	}
}

func TestPropertyPath(t *testing.T) {
	tests := []struct {
		path []string
		want string
	}{
		{nil, ""},
		{[]string{"plugin_name"}, "plugin_name"},
		{[]string{"request", "headers", "x-foo"}, "request\x00headers\x00x-foo"},
		{[]string{"", "a"}, "\x00a"},
	}
	for _, tc := range tests {
		if got := string(appendPropertyPath(nil, tc.path)); got != tc.want {
			t.Errorf("appendPropertyPath(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestProperties(t *testing.T) {
	f := installFakeHost(t)
	if err := SetProperty([]string{"sluice.decision"}, []byte("deny")); err != nil {
		t.Fatal(err)
	}
	v, err := GetProperty([]string{"sluice.decision"})
	if err != nil || string(v) != "deny" {
		t.Fatalf("GetProperty = %q, %v", v, err)
	}
	if _, err := GetProperty([]string{"request", "path"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing property: %v", err)
	}
	want := []string{`set_property "sluice.decision"`, `get_property "sluice.decision"`, `get_property "request\x00path"`}
	if !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace %q, want %q", f.trace, want)
	}
}

func TestSharedDataCas(t *testing.T) {
	installFakeHost(t)
	if _, _, err := GetSharedData("k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	if err := SetSharedData("k", []byte("v1"), 0); err != nil {
		t.Fatal(err)
	}
	v, cas, err := GetSharedData("k")
	if err != nil || string(v) != "v1" || cas == 0 {
		t.Fatalf("GetSharedData = %q, %d, %v", v, cas, err)
	}
	if err := SetSharedData("k", []byte("v2"), cas); err != nil {
		t.Fatal(err)
	}
	if err := SetSharedData("k", []byte("v3"), cas); !errors.Is(err, ErrCasMismatch) {
		t.Fatalf("stale cas: %v, want ErrCasMismatch", err)
	}
	if _, err := DequeueSharedQueue(1); !errors.Is(err, ErrEmpty) {
		t.Fatalf("dequeue: %v, want ErrEmpty", err)
	}
}

func TestMetrics(t *testing.T) {
	f := installFakeHost(t)
	c, err := DefineCounterMetric("requests")
	if err != nil {
		t.Fatal(err)
	}
	g, _ := DefineGaugeMetric("rules")
	h, _ := DefineHistogramMetric("latency_us")
	if err := c.Increment(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Increment(1 << 63); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("huge delta: %v", err)
	}
	_ = c.Increment(3)
	_ = g.Record(10)
	_ = g.Increment(-4)
	_ = h.Record(250)
	if v, err := c.Value(); err != nil || v != 3 {
		t.Fatalf("counter = %d, %v", v, err)
	}
	if v, err := g.Value(); err != nil || v != 6 {
		t.Fatalf("gauge = %d, %v", v, err)
	}
	want := []string{
		"define_metric 0 requests", "define_metric 1 rules", "define_metric 2 latency_us",
		"increment_metric 4 3", "record_metric 5 10", "increment_metric 5 -4", "record_metric 6 250",
	}
	if !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace:\n  got  %q\n  want %q", f.trace, want)
	}
}

func TestLogLevelCache(t *testing.T) {
	f := installFakeHost(t)
	// Before any callback (as in init) nothing but proxy_log is called and
	// every level goes through.
	SetVMContext(newRecorder())
	LogTrace("t0")
	if len(f.trace) != 0 || len(f.logs) != 1 {
		t.Fatalf("before start: trace %q logs %q", f.trace, f.logs)
	}
	f.level, f.levelSt = LogLevelWarn, statusOK
	onContextCreate(1, 0)
	onVMStart(1, 0)
	LogDebug("d")
	LogInfo("i")
	LogWarn("w")
	LogError("e")
	LogCritical("c")
	if want := []string{"0 t0", "3 w", "4 e", "5 c"}; !reflect.DeepEqual(f.logs, want) {
		t.Fatalf("logs %q, want %q", f.logs, want)
	}
	if LogLevelEnabled(LogLevelInfo) || !LogLevelEnabled(LogLevelWarn) {
		t.Fatal("LogLevelEnabled disagrees with the cached level")
	}
	f.level = LogLevelTrace
	onTick(1)
	if !LogLevelEnabled(LogLevelTrace) {
		t.Fatal("level not refreshed on tick")
	}
}

func TestLocalResponseAndStreamControl(t *testing.T) {
	f := installFakeHost(t)
	err := SendHttpResponseWithDetails(429, "sluice_rate_limited",
		[][2]string{{"retry-after", "2"}}, []byte("slow down"), GrpcStatusNone)
	if err != nil {
		t.Fatal(err)
	}
	_ = SendHttpResponse(503, nil, nil, 14)
	if want := []string{"429 sluice_rate_limited [retry-after=2] slow down -1", "503  []  14"}; !reflect.DeepEqual(f.localResp, want) {
		t.Fatalf("local responses %q, want %q", f.localResp, want)
	}
	_ = ResumeHttpRequest()
	_ = ResumeHttpResponse()
	_ = CloseStream(StreamTypeDownstream)
	if want := []string{"continue_stream 0 effective=0", "continue_stream 1 effective=0", "close_stream 2"}; !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace %q, want %q", f.trace, want)
	}
	if tm, err := GetCurrentTime(); err != nil || tm.UnixNano() != 1_700_000_000_123_456_789 {
		t.Fatalf("GetCurrentTime = %v, %v", tm, err)
	}
}

func TestDispatchHttpCall(t *testing.T) {
	f := installFakeHost(t)
	r := newRecorder()
	startRoot(t, r)
	onContextCreate(2, 1)
	onContextCreate(3, 1)
	r.events = nil

	var got []string
	cb := func(name string) func(int, int, int) {
		return func(nh, bs, nt int) {
			got = append(got, name+" "+strconv.FormatUint(uint64(uint32(nh)), 10)+" "+strconv.FormatUint(uint64(uint32(bs)), 10)+" "+strconv.FormatUint(uint64(uint32(nt)), 10)+" effective="+strconv.FormatUint(uint64(activeContextID), 10))
			_ = ResumeHttpRequest()
		}
	}
	headers := [][2]string{{":method", "GET"}, {":path", "/v1/policies/p"}, {":authority", "cp"}}

	// From stream 2, while its request headers callback runs.
	var tok2 uint32
	r2 := &recStreamHook{onHeaders: func() {
		var err error
		tok2, err = DispatchHttpCall("control_plane", headers, []byte("b"), [][2]string{{"t", "1"}}, 500, cb("stream2"))
		if err != nil {
			t.Fatal(err)
		}
	}}
	httpStreamOf(2).ctx = r2
	if a := onRequestHeaders(2, 3, true); a != types.ActionContinue {
		t.Fatalf("action %d", a)
	}
	// From the root context, during a tick.
	activeContextID = 1
	tokRoot, err := DispatchHttpCall("control_plane", headers, nil, nil, 0, cb("root"))
	if err != nil {
		t.Fatal(err)
	}
	// From stream 3, which is deleted before the response.
	activeContextID = 3
	tok3, _ := DispatchHttpCall("control_plane", headers, nil, nil, 0, cb("stream3"))
	onDelete(3)

	if len(f.httpCalls) != 3 || !reflect.DeepEqual(f.httpCalls[0], fakeHTTPCall{"control_plane", headers, "b", [][2]string{{"t", "1"}}, 500}) {
		t.Fatalf("http calls %+v", f.httpCalls)
	}
	if n := len(roots[1].callouts); n != 3 {
		t.Fatalf("%d callouts stored under root 1, want 3", n)
	}

	f.trace = nil
	onHttpCallResponse(1, tok2, 5, 10, 0)
	onHttpCallResponse(1, tok2, 5, 10, 0) // duplicate: ignored
	onHttpCallResponse(1, tokRoot, 0, 0, 0)
	onHttpCallResponse(1, tok3, 1, 0, 0) // stream gone: skipped
	onHttpCallResponse(9, tokRoot, 1, 0, 0)

	if want := []string{"stream2 5 10 0 effective=2", "root 0 0 0 effective=1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("callbacks %q, want %q", got, want)
	}
	if want := []string{"set_effective_context 2", "continue_stream 0 effective=2", "continue_stream 0 effective=2"}; !reflect.DeepEqual(f.trace, want) {
		t.Fatalf("trace %q, want %q", f.trace, want)
	}
	if n := len(roots[1].callouts); n != 0 {
		t.Fatalf("%d callouts left", n)
	}

	// A failed dispatch stores nothing.
	activeContextID = 1
	f.httpCallStatus = statusBadArgument
	if _, err := DispatchHttpCall("nope", nil, nil, nil, 0, cb("x")); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("bad dispatch: %v", err)
	}
	if n := len(roots[1].callouts); n != 0 {
		t.Fatalf("%d callouts after failed dispatch", n)
	}
	// Outside any known context.
	activeContextID = 77
	if _, err := DispatchHttpCall("control_plane", headers, nil, nil, 0, cb("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("dispatch from unknown context: %v", err)
	}
}

func TestGetStatus(t *testing.T) {
	f := installFakeHost(t)
	f.statusMsg = "reset"
	code, msg, err := GetStatus()
	if err != nil || code != 11 || msg != "reset" {
		t.Fatalf("GetStatus = %d, %q, %v", code, msg, err)
	}
}

// recStreamHook is an HttpContext whose request-headers callback runs a hook.
type recStreamHook struct {
	types.DefaultHttpContext
	onHeaders func()
}

func (h *recStreamHook) OnHttpRequestHeaders(int, bool) types.Action {
	h.onHeaders()
	return types.ActionContinue
}
