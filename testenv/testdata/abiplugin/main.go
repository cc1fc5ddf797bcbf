// Command abiplugin is the testenv host's test plugin: it exercises every
// proxy-wasm import through filter/proxywasm, driven by the request
// header x-op and by its plugin configuration, so that testenv/host tests
// can ask it to do each thing and assert on what comes back.
//
// Build (the host tests do this themselves, once per test binary):
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o abiplugin.wasm ./testenv/testdata/abiplugin
//
// With -tags abi_initcall its init also calls proxy_get_shared_data,
// which Envoy forbids during _initialize.
//
// It imports neither os nor fmt (see docs/ENVOY.md, WASI and the poll_oneoff
// crash).
package main

import (
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	_ "github.com/sluice-proxy/sluice/filter/proxywasm/streamexports" // it reads bodies
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) OnVMStart(int) types.OnVMStartStatus {
	cfg, err := proxywasm.GetVMConfiguration()
	proxywasm.LogInfo("vm_config=" + string(cfg) + " err=" + errString(err))
	return types.OnVMStartStatusOK
}

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct {
	types.DefaultPluginContext
	requests proxywasm.MetricCounter
	gauge    proxywasm.MetricGauge
	hist     proxywasm.MetricHistogram
	queue    uint32
	ticks    int
}

// config is "key=value,key=value".
func parseConfig(b []byte) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(string(b), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	proxywasm.LogInfo("plugin_config=" + string(raw) + " err=" + errString(err))
	// Outside on_vm_start buffer 6 is not readable.
	_, err = proxywasm.GetVMConfiguration()
	proxywasm.LogInfo("vm_config_in_configure_err=" + errString(err))
	cfg := parseConfig(raw)
	if cfg["configure"] == "fail" {
		return types.OnPluginStartStatusFailed
	}
	if t := cfg["tick"]; t != "" {
		ms, _ := strconv.Atoi(t)
		if err := proxywasm.SetTickPeriodMilliSeconds(uint32(ms)); err != nil {
			proxywasm.LogError("tick: " + err.Error())
		}
	}
	p.requests, _ = proxywasm.DefineCounterMetric("abi_requests")
	p.gauge, _ = proxywasm.DefineGaugeMetric("abi_gauge")
	p.hist, _ = proxywasm.DefineHistogramMetric("abi_hist")
	p.queue, err = proxywasm.RegisterSharedQueue("abi_queue")
	if err != nil {
		proxywasm.LogError("register queue: " + err.Error())
	}
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) OnTick() {
	p.ticks++
	now, _ := proxywasm.GetCurrentTimeNanoseconds()
	proxywasm.LogInfo("tick " + strconv.Itoa(p.ticks) + " at " + strconv.FormatInt(now, 10))
	_ = proxywasm.SetSharedData("ticks", []byte(strconv.Itoa(p.ticks)), 0)
}

func (p *pluginContext) OnQueueReady(id uint32) {
	data, err := proxywasm.DequeueSharedQueue(id)
	if err != nil {
		proxywasm.LogError("dequeue: " + err.Error())
		return
	}
	_, err = proxywasm.DequeueSharedQueue(id)
	_ = proxywasm.SetSharedData("queue_last", []byte(string(data)+" then "+errString(err)), 0)
}

func (p *pluginContext) NewHttpContext(id uint32) types.HttpContext {
	return &httpContext{id: id, plugin: p}
}

type httpContext struct {
	types.DefaultHttpContext
	id     uint32
	plugin *pluginContext
	op     string
}

// casSeen is the cas a "cas-get" request read, for the next "cas-set".
var casSeen uint32

// benchValue is the 1 KiB value of the cas1k op.
var benchValue [1024]byte

// retained keeps garbage alive across requests so the GC has work.
var retained [8][]byte

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func set(key, value string) { _ = proxywasm.AddHttpRequestHeader(key, value) }

func (h *httpContext) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	_ = h.plugin.requests.Increment(1)
	h.op, _ = proxywasm.GetHttpRequestHeader("x-op")
	switch h.op {
	case "headers":
		h.headers(numHeaders, endOfStream)
	case "reply":
		err := proxywasm.SendHttpResponseWithDetails(429, "rate  limited by abi", [][2]string{
			{"Retry-After", "7"}, {"X-Custom", "a"}, {"x-custom", "b"},
		}, []byte("denied"), 42)
		proxywasm.LogInfo("reply err=" + errString(err))
		return types.ActionContinue // forced to stop by the host
	case "property":
		properties()
	case "cas-get":
		key, _ := proxywasm.GetHttpRequestHeader("x-key")
		val, cas, err := proxywasm.GetSharedData(key)
		casSeen = cas
		set("x-result", string(val)+"/"+errString(err))
	case "cas-set":
		key, _ := proxywasm.GetHttpRequestHeader("x-key")
		v, _ := proxywasm.GetHttpRequestHeader("x-value")
		set("x-result", errString(proxywasm.SetSharedData(key, []byte(v), casSeen)))
	case "callout":
		return h.callout()
	case "panic":
		panic("abi boom")
	case "fatal":
		// A fatal runtime error, which no recover catches: the Go runtime
		// exits (proc_exit) and the VM traps, as an out-of-memory would.
		var mu sync.Mutex
		mu.Unlock() //lint:ignore SA2001 the point is the fatal error
	case "gc":
		retained[int(h.id)%len(retained)] = make([]byte, 64<<10)
		runtime.GC()
	case "time":
		ns, _ := proxywasm.GetCurrentTimeNanoseconds()
		set("x-host-ns", strconv.FormatInt(ns, 10))
	case "metric":
		_ = h.plugin.gauge.Record(40)
		_ = h.plugin.gauge.Increment(2)
		_ = h.plugin.hist.Record(7)
		_ = h.plugin.hist.Record(9)
		v, err := h.plugin.requests.Value()
		set("x-requests", strconv.FormatUint(v, 10)+"/"+errString(err))
	case "enqueue":
		v, _ := proxywasm.GetHttpRequestHeader("x-value")
		q, err := proxywasm.ResolveSharedQueue("", "abi_queue")
		if err == nil {
			err = proxywasm.EnqueueSharedQueue(q, []byte(v))
		}
		_, nf := proxywasm.ResolveSharedQueue("", "no_such_queue")
		set("x-result", errString(err)+"/"+errString(nf))
	case "close":
		_ = proxywasm.CloseStream(proxywasm.StreamTypeHttpRequest)
		return types.ActionPause
	case "log":
		proxywasm.LogTrace("trace line")
		proxywasm.LogDebug("debug line")
		proxywasm.LogInfo("info line")
		proxywasm.LogWarn("warn line")
	case "read3": // BenchmarkRequestHeaders
		_, _ = proxywasm.GetHttpRequestHeader("x-a")
		_, _ = proxywasm.GetHttpRequestHeader("x-b")
		_, _ = proxywasm.GetHttpRequestHeader("x-c")
	case "cas1k": // BenchmarkSharedDataCAS
		_, cas, _ := proxywasm.GetSharedData("bench")
		if err := proxywasm.SetSharedData("bench", benchValue[:], cas); err != nil {
			proxywasm.LogError("cas1k: " + err.Error())
		}
	}
	return types.ActionContinue
}

// headers (x-op: headers) reads request headers every way the ABI offers and
// writes what it saw into new ones.
func (h *httpContext) headers(numHeaders int, endOfStream bool) {
	a, _ := proxywasm.GetHttpRequestHeader("x-a")
	b, _ := proxywasm.GetHttpRequestHeader("X-B") // lower-cased by the host
	c, _ := proxywasm.GetHttpRequestHeader("x-c") // repeated: first value
	_, missing := proxywasm.GetHttpRequestHeader("x-missing")
	all, _ := proxywasm.GetHttpRequestHeaders()
	size, _ := proxywasm.GetHeaderMapSize(proxywasm.MapTypeHttpRequestHeaders)
	set("x-seen", a+"|"+b+"|"+c)
	set("x-missing-err", errString(missing))
	set("x-count", strconv.Itoa(numHeaders)+"/"+strconv.Itoa(len(all))+"/"+strconv.FormatBool(endOfStream))
	set("x-size", strconv.Itoa(int(size)))
	set("X-Upper", "lowered")
	_ = proxywasm.ReplaceHttpRequestHeader("x-replace", "new")
	_ = proxywasm.RemoveHttpRequestHeader("x-remove")
	_ = proxywasm.ReplaceHttpRequestHeader(":path", "/rewritten")
}

// properties (x-op: property) sets a property, reads it back, and reads
// every property the host defines into headers.
func properties() {
	v, _ := proxywasm.GetHttpRequestHeader("x-value")
	if err := proxywasm.SetProperty([]string{"abi_decision"}, []byte(v)); err != nil {
		set("x-set-err", err.Error())
	}
	back, err := proxywasm.GetProperty([]string{"abi_decision"})
	set("x-readback", string(back)+"/"+errString(err))
	for _, p := range [][]string{
		{"source", "address"}, {"request", "path"}, {"request", "url_path"}, {"request", "method"},
		{"request", "id"}, {"request", "host"}, {"request", "scheme"}, {"request", "useragent"},
		{"request", "headers", "x-value"}, {"plugin_name"}, {"plugin_root_id"}, {"plugin_vm_id"},
		{"response", "code"}, {"no_such_property"},
	} {
		val, err := proxywasm.GetProperty(p)
		set("x-prop-"+strings.Join(p, "."), string(val)+"/"+errString(err))
	}
	m, _ := proxywasm.GetProperty([]string{"request", "headers"})
	set("x-prop-headers-bytes", strconv.Itoa(len(m)))
	cid, _ := proxywasm.GetProperty([]string{"connection_id"})
	set("x-prop-connection-id-len", strconv.Itoa(len(cid)))
}

// callout (x-op: callout) dispatches an HTTP call to the cluster x-cluster
// names and pauses until it answers.
func (h *httpContext) callout() types.Action {
	cluster, _ := proxywasm.GetHttpRequestHeader("x-cluster")
	hdrs := [][2]string{{":method", "GET"}, {":path", "/cp?q=1"}, {":authority", "cp.internal"}, {"x-from", "abi"}}
	if drop, _ := proxywasm.GetHttpRequestHeader("x-drop"); drop != "" {
		out := hdrs[:0]
		for _, kv := range hdrs {
			if kv[0] != drop {
				out = append(out, kv)
			}
		}
		hdrs = out
	}
	timeout := uint32(0)
	if t, _ := proxywasm.GetHttpRequestHeader("x-timeout"); t != "" {
		n, _ := strconv.Atoi(t)
		timeout = uint32(n)
	}
	_, err := proxywasm.DispatchHttpCall(cluster, hdrs, nil, nil, timeout, h.onCallout)
	if err != nil {
		set("x-callout", "dispatch: "+err.Error())
		return types.ActionContinue
	}
	return types.ActionPause
}

func (h *httpContext) onCallout(numHeaders, bodySize, numTrailers int) {
	if numHeaders == 0 {
		code, msg, err := proxywasm.GetStatus()
		set("x-callout", "failed "+strconv.Itoa(int(code))+" "+msg+" "+errString(err))
	} else {
		status, _ := proxywasm.GetHttpCallResponseHeader(":status")
		hdr, _ := proxywasm.GetHttpCallResponseHeader("x-cp")
		body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
		set("x-callout", status+" "+hdr+" "+string(body)+" "+errString(err)+" "+strconv.Itoa(numTrailers))
	}
	if err := proxywasm.ResumeHttpRequest(); err != nil {
		proxywasm.LogError("resume: " + err.Error())
	}
}

func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	switch h.op {
	case "pause-body":
		if !endOfStream {
			return types.ActionPause // buffer until the end
		}
		body, _ := proxywasm.GetHttpRequestBody(0, bodySize)
		_ = proxywasm.SetHttpRequestBody([]byte(strings.ToUpper(string(body))))
	case "body":
		body, _ := proxywasm.GetHttpRequestBody(0, bodySize)
		_ = proxywasm.SetHttpRequestBody([]byte(strings.ToUpper(string(body))))
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseHeaders(numHeaders int, endOfStream bool) types.Action {
	_ = proxywasm.AddHttpResponseHeader("x-abi-resp", h.op)
	if h.op == "property" {
		code, err := proxywasm.GetProperty([]string{"response", "code"})
		n := uint64(0)
		for i := len(code) - 1; i >= 0; i-- {
			n = n<<8 | uint64(code[i])
		}
		_ = proxywasm.SetProperty([]string{"abi_status"}, []byte(strconv.FormatUint(n, 10)+"/"+strconv.Itoa(len(code))+"/"+errString(err)))
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	if h.op == "body" {
		body, _ := proxywasm.GetHttpResponseBody(0, bodySize)
		_ = proxywasm.SetHttpResponseBody([]byte(strings.ToUpper(string(body))))
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpStreamDone() {
	proxywasm.LogInfo("stream done " + strconv.Itoa(int(h.id)))
}
