//go:build !wasip1

package proxywasm

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// trivialPlugin is a VMContext, PluginContext and HttpContext at once: on
// request headers it reads two headers, one property, the clock and one
// shared-data counter, writes the counter back with its cas, sets one
// property, counts the request in a metric and answers every other request
// with a local reply; on response headers it adds one header. It keeps one
// HttpContext for every stream (the emulator runs one at a time), so it
// allocates nothing itself, and reads host data inside a host-scratch
// scope.
type trivialPlugin struct {
	types.DefaultVMContext
	types.DefaultPluginContext
	types.DefaultHttpContext

	t        *testing.T
	requests MetricCounter
	counter  [8]byte
	seen     uint64 // last counter value read
	failures int
}

var (
	propSource       = []string{"source", "address"}
	propDecision     = []string{"sluice.decision"}
	decisionAllow    = []byte("allow")
	decisionDeny     = []byte("deny")
	replyHeaders     = [][2]string{{"retry-after", "1"}, {"X-RateLimit-Limit", "10"}}
	replyBody        = []byte("slow down")
	trivialReqHeader = [][2]string{{":method", "GET"}, {":path", "/a"}, {"X-API-Key", "k1"}, {"x-api-key", "k2"}}
	trivialRespHdr   = [][2]string{{":status", "200"}}
)

func (p *trivialPlugin) NewPluginContext(uint32) types.PluginContext { return p }

func (p *trivialPlugin) OnPluginStart(int) types.OnPluginStartStatus {
	conf, err := GetPluginConfiguration()
	if err != nil || string(conf) != "conf" {
		return false
	}
	p.requests, err = DefineCounterMetric("requests")
	return err == nil
}

func (p *trivialPlugin) NewHttpContext(uint32) types.HttpContext { return p }

func (p *trivialPlugin) fail() { p.failures++ }

func (p *trivialPlugin) OnHttpRequestHeaders(int, bool) types.Action {
	BeginHostScratch()
	defer EndHostScratch()
	if v, err := GetHttpRequestHeader(":path"); err != nil || v != "/a" {
		p.fail()
	}
	if v, err := GetHttpRequestHeader("x-api-key"); err != nil || v != "k1" {
		p.fail()
	}
	if v, err := GetProperty(propSource); err != nil || string(v) != "10.0.0.1:5000" {
		p.fail()
	}
	if now, err := GetCurrentTimeNanoseconds(); err != nil || now != EmulatorDefaultTime {
		p.fail()
	}
	var n uint64
	v, cas, err := GetSharedData("counter")
	switch {
	case err == nil && len(v) == 8:
		n = binary.LittleEndian.Uint64(v)
	case errors.Is(err, ErrNotFound):
	default:
		p.fail()
	}
	p.seen = n
	binary.LittleEndian.PutUint64(p.counter[:], n+1)
	if err := SetSharedData("counter", p.counter[:], cas); err != nil {
		p.fail()
	}
	if err := p.requests.Increment(1); err != nil {
		p.fail()
	}
	if n%2 == 1 {
		if err := SetProperty(propDecision, decisionDeny); err != nil {
			p.fail()
		}
		if err := SendHttpResponseWithDetails(429, "rate_limited", replyHeaders, replyBody, GrpcStatusNone); err != nil {
			p.fail()
		}
		return types.ActionPause
	}
	if err := SetProperty(propDecision, decisionAllow); err != nil {
		p.fail()
	}
	return types.ActionContinue
}

func (p *trivialPlugin) OnHttpResponseHeaders(int, bool) types.Action {
	BeginHostScratch()
	defer EndHostScratch()
	if err := AddHttpResponseHeader("X-RateLimit-Remaining", "5"); err != nil {
		p.fail()
	}
	return types.ActionContinue
}

func newTrivialEmulator(t *testing.T) (*trivialPlugin, *Emulator) {
	t.Helper()
	p := &trivialPlugin{t: t}
	e, err := NewEmulator(p, EmulatorOptions{
		PluginConfig: []byte("conf"),
		Properties:   map[string]string{"source.address": "10.0.0.1:5000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return p, e
}

// runTrivialStream runs one stream as Envoy would and reports whether it
// was answered locally.
func runTrivialStream(e *Emulator) (id uint32, denied bool) {
	id = e.NewStream()
	a := e.RequestHeaders(id, trivialReqHeader, true)
	_, _, _, denied = e.LocalReply(id)
	if a == types.ActionContinue && !denied {
		e.ResponseHeaders(id, trivialRespHdr, false)
	}
	e.StreamDone(id)
	return id, denied
}

func TestEmulatorStreamsDoNotAllocate(t *testing.T) {
	p, e := newTrivialEmulator(t)
	for range 100 { // warm up: slabs, maps, free lists
		runTrivialStream(e)
	}
	e.ResetCalls()
	start := p.seen + 1
	denied := 0
	const runs = 1000
	ran := 0
	stream := func() {
		ran++
		if _, d := runTrivialStream(e); d {
			denied++
		}
	}
	allocs := testing.AllocsPerRun(runs, stream)
	if allocs != 0 {
		t.Errorf("%v allocations per stream, want 0", allocs)
	}
	if n := LeastHeapAllocs(runs, stream); n != 0 {
		t.Errorf("%d allocations in %d streams, want 0", n, runs)
	}
	if p.failures != 0 {
		t.Fatalf("%d hostcall results were wrong", p.failures)
	}
	streams := uint64(ran)
	if p.seen != start+streams-1 {
		t.Fatalf("counter read %d in the last stream, want %d", p.seen, start+streams-1)
	}
	if d := uint64(denied); d < streams/2 || d > streams/2+1 {
		t.Fatalf("%d of %d streams denied, want every other", denied, streams)
	}
	want := map[string]uint64{
		"proxy_get_header_map_value":         2 * streams,
		"proxy_get_property":                 streams,
		"proxy_get_current_time_nanoseconds": streams,
		"proxy_get_shared_data":              streams,
		"proxy_set_shared_data":              streams,
		"proxy_increment_metric":             streams,
		"proxy_set_property":                 streams,
		"proxy_send_local_response":          uint64(denied),
		"proxy_add_header_map_value":         streams - uint64(denied),
	}
	if got := e.Calls(); !reflect.DeepEqual(got, want) {
		t.Fatalf("hostcalls\n  got  %v\n  want %v", got, want)
	}
	if v, ok := e.Metric("requests"); !ok || v != p.seen+1 {
		t.Fatalf("metric requests = %d, %v; want %d", v, ok, p.seen+1)
	}
}

func TestEmulatorStreamState(t *testing.T) {
	_, e := newTrivialEmulator(t)
	allowed, _ := runTrivialStream(e) // counter 0: allowed
	denied, _ := runTrivialStream(e)  // counter 1: denied

	if _, _, _, ok := e.LocalReply(allowed); ok {
		t.Fatal("allowed stream has a local reply")
	}
	if got, want := e.ResponseHeaderMap(allowed), [][2]string{{":status", "200"}, {"x-ratelimit-remaining", "5"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("response headers %q, want %q", got, want)
	}
	if got := e.FilterState(allowed); !reflect.DeepEqual(got, map[string]string{"wasm.sluice.decision": "allow"}) {
		t.Fatalf("filter state %q", got)
	}

	code, body, headers, ok := e.LocalReply(denied)
	if !ok || code != 429 || string(body) != "slow down" ||
		!reflect.DeepEqual(headers, [][2]string{{"retry-after", "1"}, {"x-ratelimit-limit", "10"}}) {
		t.Fatalf("local reply %d %q %q %v", code, body, headers, ok)
	}
	if details, grpc, ok := e.LocalReplyDetails(denied); !ok || details != "rate_limited" || grpc != GrpcStatusNone {
		t.Fatalf("details %q, %d, %v", details, grpc, ok)
	}
	if e.ResponseHeaderMap(denied) != nil {
		t.Fatal("denied stream has response headers")
	}
	if got := e.FilterState(denied); got["wasm.sluice.decision"] != "deny" {
		t.Fatalf("filter state %q", got)
	}

	// Finished streams stay readable for 16 more streams, then are reused.
	for range emulatorRetainedStreams - 1 {
		runTrivialStream(e)
	}
	if _, _, _, ok := e.LocalReply(denied); !ok {
		t.Fatal("finished stream forgotten too early")
	}
	runTrivialStream(e)
	if _, _, _, ok := e.LocalReply(denied); ok || e.FilterState(denied) != nil {
		t.Fatal("finished stream still readable after 16 more")
	}
}

func TestEmulatorHeaders(t *testing.T) {
	e, err := NewEmulator(&types.DefaultVMContext{}, EmulatorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	id := e.NewStream()
	e.RequestHeaders(id, [][2]string{{":path", "/"}, {"X-A", "1"}, {"x-a", "2"}, {"b", ""}}, true)
	e.effective = id // as inside the stream's callback

	if v, err := GetHttpRequestHeader("X-a"); err != nil || v != "1" {
		t.Fatalf("first value = %q, %v", v, err)
	}
	if v, err := GetHttpRequestHeader("b"); err != nil || v != "" {
		t.Fatalf("empty value = %q, %v", v, err)
	}
	if _, err := GetHttpRequestHeader("c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing header: %v", err)
	}
	if _, err := GetHttpResponseHeader(":status"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("response map before response headers: %v", err)
	}
	if err := ReplaceHttpRequestHeader("X-A", "3"); err != nil {
		t.Fatal(err)
	}
	_ = AddHttpRequestHeader("D", "4")
	_ = RemoveHttpRequestHeader("b")
	got, err := GetHttpRequestHeaders()
	if want := [][2]string{{":path", "/"}, {"x-a", "3"}, {"d", "4"}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("headers %q, %v; want %q", got, err, want)
	}
	if size, err := GetHeaderMapSize(MapTypeHttpRequestHeaders); err != nil || size != 4+3*8+(5+1+1+1)+(3+1+1+1)+(1+1+1+1) {
		t.Fatalf("map size %d, %v", size, err)
	}
	if err := ReplaceHttpRequestHeaders([][2]string{{"E", "5"}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := GetHttpRequestHeaders(); !reflect.DeepEqual(got, [][2]string{{"e", "5"}}) {
		t.Fatalf("after set: %q", got)
	}
	// The root context has no stream: no maps, no filter state, and a
	// local reply does nothing.
	e.effective = EmulatorRootContextID
	if _, err := GetHttpRequestHeader("e"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("root context reads headers: %v", err)
	}
	if err := SetProperty([]string{"x"}, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("root SetProperty: %v", err)
	}
	if err := SendHttpResponse(403, nil, nil, GrpcStatusNone); err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := e.LocalReply(id); ok {
		t.Fatal("root-context local reply landed on a stream")
	}
}

func TestEmulatorSharedDataCas(t *testing.T) {
	e, err := NewEmulator(&types.DefaultVMContext{}, EmulatorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, _, err := GetSharedData("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	// A new key is created whatever the cas; cas values come from one
	// counter starting at 1.
	if err := SetSharedData("a", []byte("1"), 0xFFFFFFFF); err != nil {
		t.Fatal(err)
	}
	if v, cas, err := GetSharedData("a"); err != nil || string(v) != "1" || cas != 1 {
		t.Fatalf("a = %q, cas %d, %v; want 1, cas 1", v, cas, err)
	}
	if err := SetSharedData("b", nil, 0); err != nil {
		t.Fatal(err)
	}
	if v, cas, err := GetSharedData("b"); err != nil || v != nil || cas != 2 {
		t.Fatalf("b = %q, cas %d, %v; want empty, cas 2", v, cas, err)
	}
	if err := SetSharedData("a", []byte("2"), 1); err != nil {
		t.Fatal(err)
	}
	if err := SetSharedData("a", []byte("3"), 1); !errors.Is(err, ErrCasMismatch) {
		t.Fatalf("stale cas: %v", err)
	}
	if err := SetSharedData("a", []byte("4"), 0); err != nil {
		t.Fatal(err)
	}
	// Another worker's write.
	if cas := e.SetSharedData("a", []byte("5")); cas != 5 {
		t.Fatalf("worker write cas %d, want 5", cas)
	}
	if v, cas, ok := e.SharedData("a"); !ok || string(v) != "5" || cas != 5 {
		t.Fatalf("SharedData(a) = %q, %d, %v", v, cas, ok)
	}
	if got := e.Calls(); got["proxy_set_shared_data"] != 5 || got["proxy_get_shared_data"] != 3 {
		t.Fatalf("calls %v", got)
	}
}

func TestEmulatorMetricsPropertiesClock(t *testing.T) {
	e, err := NewEmulator(&types.DefaultVMContext{}, EmulatorOptions{
		Properties: map[string]string{"xds.node.id": "node-1", "plugin_name": "sluice"},
		StartTime:  42,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, _ := DefineCounterMetric("c")
	g, _ := DefineGaugeMetric("g")
	h, _ := DefineHistogramMetric("h")
	if c2, _ := DefineCounterMetric("c"); c2 != c || c == MetricCounter(g) {
		t.Fatalf("ids c %d, c again %d, g %d", c, c2, g)
	}
	_ = c.Increment(3)
	_ = g.Increment(-2)
	_ = g.Record(7)
	_ = h.Record(9)
	if err := hostIncrementMetricErr(uint32(c), -1); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("negative counter increment: %v", err)
	}
	if v, err := c.Value(); err != nil || v != 3 {
		t.Fatalf("counter %d, %v", v, err)
	}
	if v, err := g.Value(); err != nil || v != 7 {
		t.Fatalf("gauge %d, %v", v, err)
	}
	if _, err := getMetric(uint32(h)); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("histogram get: %v", err)
	}
	if _, err := getMetric(99 << 2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown metric: %v", err)
	}

	if v, err := GetProperty([]string{"xds", "node", "id"}); err != nil || string(v) != "node-1" {
		t.Fatalf("xds.node.id = %q, %v", v, err)
	}
	if v, err := GetProperty([]string{"plugin_name"}); err != nil || string(v) != "sluice" {
		t.Fatalf("plugin_name = %q, %v", v, err)
	}
	if _, err := GetProperty([]string{"node", "id"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown property: %v", err)
	}
	// A stream reads its own filter state back.
	id := e.NewStream()
	e.effective = id
	_ = SetProperty([]string{"k"}, []byte("v1"))
	_ = SetProperty([]string{"k"}, []byte("v2"))
	if v, err := GetProperty([]string{"k"}); err != nil || string(v) != "v2" {
		t.Fatalf("filter state read back %q, %v", v, err)
	}
	if got := e.FilterState(id); !reflect.DeepEqual(got, map[string]string{"wasm.k": "v2"}) {
		t.Fatalf("filter state %q", got)
	}

	if now, _ := GetCurrentTimeNanoseconds(); now != 42 {
		t.Fatalf("clock %d, want the start time", now)
	}
	e.SetTime(1_000)
	e.Advance(5)
	if now, _ := GetCurrentTimeNanoseconds(); now != 1_005 || e.Now() != 1_005 {
		t.Fatalf("clock %d", now)
	}
}

func hostIncrementMetricErr(id uint32, delta int64) error {
	return statusError(hostIncrementMetric(id, delta))
}

func TestEmulatorLifecycleAndClose(t *testing.T) {
	r := newRecorder()
	e, err := NewEmulator(r, EmulatorOptions{VMConfig: []byte("vm"), PluginConfig: []byte("plugin")})
	if err != nil {
		t.Fatal(err)
	}
	assertEvents(t, r, "1 new_plugin", "0 vm_start 2", "1 plugin_start 6")
	id := e.NewStream()
	e.RequestHeaders(id, [][2]string{{"a", "1"}}, false)
	e.ResponseHeaders(id, nil, true)
	e.StreamDone(id)
	e.StreamDone(id) // once only
	e.Tick()
	assertEvents(t, r, "2 new_http", "2 request_headers 1 0", "2 response_headers 0 1", "2 http_stream_done", "1 tick")
	if e.RequestHeaders(id, nil, true) != types.ActionContinue {
		t.Fatal("finished stream did not continue")
	}
	assertEvents(t, r)
	e.Close()
	if _, err := GetHttpRequestHeader("a"); !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("after Close: %v, want ErrUnimplemented", err)
	}

	// A failing configure is reported.
	r = newRecorder()
	r.configure = false
	if _, err := NewEmulator(r, EmulatorOptions{}); !errors.Is(err, ErrEmulatorConfigure) {
		t.Fatalf("failing configure: %v", err)
	}
	host = unimplementedHost{}
	SetVMContext(nil)
}

func TestEmulatorHTTPCall(t *testing.T) {
	e, err := NewEmulator(&types.DefaultVMContext{}, EmulatorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var got []string
	e.effective = EmulatorRootContextID
	activeContextID = EmulatorRootContextID
	headers := [][2]string{{":method", "GET"}, {":path", "/p"}, {":authority", "cp"}}
	tok, err := DispatchHttpCall("cp", headers, []byte("q"), nil, 100, func(nh, bs, nt int) {
		st, _ := GetHttpCallResponseHeader(":status")
		body, _ := GetHttpCallResponseBody(0, bs)
		got = append(got, st+" "+string(body))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DispatchHttpCall("cp", nil, nil, nil, 0, nil); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("missing pseudo-headers: %v", err)
	}
	calls := e.HTTPCalls()
	if len(calls) != 1 || calls[0].Token != tok || calls[0].Cluster != "cp" || !reflect.DeepEqual(calls[0].Headers, headers) || string(calls[0].Body) != "q" || calls[0].TimeoutMillis != 100 {
		t.Fatalf("pending calls %+v", calls)
	}
	if !e.RespondHTTPCall(tok, [][2]string{{":status", "200"}}, []byte("ok")) || e.RespondHTTPCall(tok, nil, nil) {
		t.Fatal("RespondHTTPCall: first must succeed, second must report an unknown token")
	}
	if !reflect.DeepEqual(got, []string{"200 ok"}) {
		t.Fatalf("callback saw %q", got)
	}
	if _, err := GetHttpCallResponseHeaders(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("call response readable after the callback: %v", err)
	}
}

// TestAPIDoesNotAllocate holds the request-path functions of the binding to
// zero heap allocations once warm, inside a host-scratch scope, over the
// emulator (which allocates nothing itself).
func TestAPIDoesNotAllocate(t *testing.T) {
	e, err := NewEmulator(&types.DefaultVMContext{}, EmulatorOptions{
		Properties: map[string]string{"source.address": "10.0.0.1:5000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	id := e.NewStream()
	e.RequestHeaders(id, trivialReqHeader, false)
	e.ResponseHeaders(id, trivialRespHdr, false)
	e.effective = id
	e.SetSharedData("counter", make([]byte, 8))
	value := []byte("12345678")

	tests := []struct {
		name string
		f    func() error
	}{
		{"SendHttpResponseWithDetails", func() error {
			return SendHttpResponseWithDetails(429, "rate_limited", replyHeaders, replyBody, GrpcStatusNone)
		}},
		{"SetProperty", func() error { return SetProperty(propDecision, decisionDeny) }},
		{"AddHttpResponseHeader", func() error {
			// A fresh response map each time, so that the map does not grow.
			e.streams[id].resp.reset()
			e.streams[id].resp.present = true
			return AddHttpResponseHeader("x-ratelimit-remaining", "5")
		}},
		{"GetHttpRequestHeader", func() error {
			v, err := GetHttpRequestHeader("x-api-key")
			if err == nil && v != "k1" {
				return errors.New("wrong value " + v)
			}
			return err
		}},
		{"GetSharedData", func() error {
			v, _, err := GetSharedData("counter")
			if err == nil && len(v) != 8 {
				return errors.New("wrong value")
			}
			return err
		}},
		{"SetSharedData", func() error { return SetSharedData("counter", value, 0) }},
		{"GetCurrentTimeNanoseconds", func() error {
			_, err := GetCurrentTimeNanoseconds()
			return err
		}},
		{"GetProperty", func() error {
			v, err := GetProperty(propSource)
			if err == nil && string(v) != "10.0.0.1:5000" {
				return errors.New("wrong value")
			}
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			scope := func() {
				BeginHostScratch()
				for range 10 {
					if e := tc.f(); e != nil {
						err = e
					}
				}
				EndHostScratch()
			}
			if allocs := testing.AllocsPerRun(100, scope); allocs != 0 {
				t.Errorf("10 calls: %v allocations, want 0", allocs)
			}
			if n := LeastHeapAllocs(100, scope); n != 0 {
				t.Errorf("100 × 10 calls: %d allocations, want 0", n)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
