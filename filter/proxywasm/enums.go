package proxywasm

// LogLevel is a proxy-wasm log level (spec v0.2.1, "proxy_log"):
// TRACE 0 through CRITICAL 5.
type LogLevel uint32

// Log levels, spec v0.2.1 "Types".
const (
	LogLevelTrace    LogLevel = 0
	LogLevelDebug    LogLevel = 1
	LogLevelInfo     LogLevel = 2
	LogLevelWarn     LogLevel = 3
	LogLevelError    LogLevel = 4
	LogLevelCritical LogLevel = 5
)

// BufferType selects a host buffer for proxy_get_buffer_bytes,
// proxy_set_buffer_bytes and proxy_get_buffer_status (spec v0.2.1
// "Buffers").
type BufferType uint32

// Buffer types, spec v0.2.1 "Types". The HTTP call response body is buffer
// 4 (the spec text of proxy_on_http_call_response says 1; Envoy and every
// SDK use 4).
const (
	BufferTypeHttpRequestBody         BufferType = 0
	BufferTypeHttpResponseBody        BufferType = 1
	BufferTypeDownstreamData          BufferType = 2
	BufferTypeUpstreamData            BufferType = 3
	BufferTypeHttpCallResponseBody    BufferType = 4
	BufferTypeGrpcReceiveBuffer       BufferType = 5
	BufferTypeVMConfiguration         BufferType = 6
	BufferTypePluginConfiguration     BufferType = 7
	BufferTypeForeignFunctionArgument BufferType = 8
)

// MapType selects a host header map for the proxy_*_header_map_* calls
// (spec v0.2.1 "HTTP fields").
type MapType uint32

// Map types, spec v0.2.1 "Types".
const (
	MapTypeHttpRequestHeaders       MapType = 0
	MapTypeHttpRequestTrailers      MapType = 1
	MapTypeHttpResponseHeaders      MapType = 2
	MapTypeHttpResponseTrailers     MapType = 3
	MapTypeGrpcReceiveInitialMeta   MapType = 4
	MapTypeGrpcReceiveTrailingMeta  MapType = 5
	MapTypeHttpCallResponseHeaders  MapType = 6
	MapTypeHttpCallResponseTrailers MapType = 7
)

// StreamType selects the stream for proxy_continue_stream and
// proxy_close_stream (spec v0.2.1 "Types").
type StreamType uint32

// Stream types, spec v0.2.1 "Types". Envoy answers
// proxy_continue_stream(StreamTypeUpstream) with UNIMPLEMENTED.
const (
	StreamTypeHttpRequest  StreamType = 0
	StreamTypeHttpResponse StreamType = 1
	StreamTypeDownstream   StreamType = 2
	StreamTypeUpstream     StreamType = 3
)

// MetricType is the kind of metric created by proxy_define_metric (spec
// v0.2.1 "Metrics").
type MetricType uint32

// Metric types, spec v0.2.1 "Types".
const (
	MetricTypeCounter   MetricType = 0
	MetricTypeGauge     MetricType = 1
	MetricTypeHistogram MetricType = 2
)
