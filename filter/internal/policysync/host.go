package policysync

import "github.com/sluice-proxy/sluice/filter/proxywasm"

// Host is what a Syncer needs from the proxy: shared data, HTTP callouts,
// logging and metrics. ProxyWasm returns the real one; tests substitute a
// fake. Every method is called from the VM's own callbacks (tick, request,
// callout response), never concurrently.
type Host interface {
	// GetSharedData and SetSharedData are proxywasm.GetSharedData and
	// proxywasm.SetSharedData: errors.Is(err, proxywasm.ErrNotFound) for a
	// key never set, proxywasm.ErrCasMismatch for a stale cas.
	GetSharedData(key string) (value []byte, cas uint32, err error)
	SetSharedData(key string, value []byte, cas uint32) error
	// DispatchHttpCall is proxywasm.DispatchHttpCall; callback runs later,
	// from the root context's proxy_on_http_call_response.
	DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
		timeoutMillis uint32, callback func(numHeaders, bodySize, numTrailers int)) (uint32, error)
	// GetHttpCallResponseHeader and GetHttpCallResponseBody read the
	// response inside the callback.
	GetHttpCallResponseHeader(key string) (string, error)
	GetHttpCallResponseBody(start, maxSize int) ([]byte, error)
	// Log writes one line at level.
	Log(level proxywasm.LogLevel, msg string)
	// Counter defines the counter name and adds delta to it (0 only defines
	// it, at 0); Gauge sets the gauge
	// name to value. Errors are ignored: metrics never stop sync.
	Counter(name string, delta uint64)
	Gauge(name string, value uint64)
}

// ProxyWasm returns the Host backed by package proxywasm. Metrics are
// defined on first use (proxy_define_metric is not allowed in init); a
// metric the host refuses is skipped silently.
func ProxyWasm() Host {
	return &proxyWasmHost{counters: map[string]proxywasm.MetricCounter{}, gauges: map[string]proxywasm.MetricGauge{}}
}

type proxyWasmHost struct {
	counters map[string]proxywasm.MetricCounter
	gauges   map[string]proxywasm.MetricGauge
}

func (*proxyWasmHost) GetSharedData(key string) ([]byte, uint32, error) {
	return proxywasm.GetSharedData(key)
}

func (*proxyWasmHost) SetSharedData(key string, value []byte, cas uint32) error {
	return proxywasm.SetSharedData(key, value, cas)
}

func (*proxyWasmHost) DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillis uint32, callback func(numHeaders, bodySize, numTrailers int)) (uint32, error) {
	return proxywasm.DispatchHttpCall(cluster, headers, body, trailers, timeoutMillis, callback)
}

func (*proxyWasmHost) GetHttpCallResponseHeader(key string) (string, error) {
	return proxywasm.GetHttpCallResponseHeader(key)
}

func (*proxyWasmHost) GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return proxywasm.GetHttpCallResponseBody(start, maxSize)
}

func (*proxyWasmHost) Log(level proxywasm.LogLevel, msg string) { proxywasm.Log(level, msg) }

func (h *proxyWasmHost) Counter(name string, delta uint64) {
	m, ok := h.counters[name]
	if !ok {
		var err error
		if m, err = proxywasm.DefineCounterMetric(name); err != nil {
			return
		}
		h.counters[name] = m
	}
	if delta > 0 { // Envoy refuses an increment of 0; defining it is enough
		_ = m.Increment(delta)
	}
}

func (h *proxyWasmHost) Gauge(name string, value uint64) {
	m, ok := h.gauges[name]
	if !ok {
		var err error
		if m, err = proxywasm.DefineGaugeMetric(name); err != nil {
			return
		}
		h.gauges[name] = m
	}
	_ = m.Record(value)
}

// GetProperty makes the ProxyWasm host a PropertyReader.
func (*proxyWasmHost) GetProperty(path []string) ([]byte, error) { return proxywasm.GetProperty(path) }
