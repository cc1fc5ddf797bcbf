package host

import (
	"errors"
	"strconv"
	"strings"
)

// Headers is an ordered header map, as Envoy's HeaderMap: keys are
// lower-case on the wire to the guest, repeated keys are separate entries,
// and pseudo-headers (":method", ":path", ":authority", ":scheme",
// ":status") come first.
type Headers [][2]string

// Get returns the first value of key (compared case-insensitively), or ""
// if there is none; this is what Envoy's proxy_get_header_map_value
// answers for a repeated header (ENVOY-CTX; docs/ENVOY.md, Header maps).
func (h Headers) Get(key string) string {
	v, _ := h.Lookup(key)
	return v
}

// Lookup is Get that also reports whether the key is present.
func (h Headers) Lookup(key string) (string, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv[0], key) {
			return kv[1], true
		}
	}
	return "", false
}

// Values returns every value of key in order.
func (h Headers) Values(key string) []string {
	var out []string
	for _, kv := range h {
		if strings.EqualFold(kv[0], key) {
			out = append(out, kv[1])
		}
	}
	return out
}

// Clone returns a copy that shares no storage with h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(Headers(nil), h...)
}

// normalize lower-cases every key and moves pseudo-headers in front of
// the others, keeping relative order (Envoy's HeaderMapImpl keeps
// pseudo-headers first).
func (h Headers) normalize() Headers {
	out := make(Headers, 0, len(h))
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") {
			out = append(out, [2]string{strings.ToLower(kv[0]), kv[1]})
		}
	}
	for _, kv := range h {
		if !strings.HasPrefix(kv[0], ":") {
			out = append(out, [2]string{strings.ToLower(kv[0]), kv[1]})
		}
	}
	return out
}

// add appends key (already lower-case) like Envoy's addCopy: a
// pseudo-header goes after the last pseudo-header.
func (h Headers) add(key, value string) Headers {
	if strings.HasPrefix(key, ":") {
		i := 0
		for i < len(h) && strings.HasPrefix(h[i][0], ":") {
			i++
		}
		h = append(h, [2]string{})
		copy(h[i+1:], h[i:])
		h[i] = [2]string{key, value}
		return h
	}
	return append(h, [2]string{key, value})
}

// remove deletes every entry of key (already lower-case).
func (h Headers) remove(key string) Headers {
	out := h[:0]
	for _, kv := range h {
		if kv[0] != key {
			out = append(out, kv)
		}
	}
	return out
}

// byteSize is Envoy's HeaderMap::byteSize: the sum of key and value
// lengths, which proxy_get_header_map_size returns (ENVOY-CTX
// getHeaderMapSize).
func (h Headers) byteSize() int {
	n := 0
	for _, kv := range h {
		n += len(kv[0]) + len(kv[1])
	}
	return n
}

// LogLevel is a proxy-wasm log level (spec "Types": TRACE 0 … CRITICAL 5).
type LogLevel int32

// The proxy-wasm log levels.
const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// String returns the level's lower-case name, e.g. "info".
func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return "level(" + strconv.FormatInt(int64(l), 10) + ")"
}

// LogEntry is one line logged by a guest through proxy_log, or written to
// stdout (info) or stderr (error) through WASI fd_write.
type LogEntry struct {
	// Worker is the index of the worker VM that logged, or -1 for the
	// canary VM.
	Worker int
	// ContextID is the effective context of the VM call that logged (0
	// during _initialize).
	ContextID uint32
	Level     LogLevel
	Message   string
}

// MetricType is a proxy-wasm metric type (spec: COUNTER 0, GAUGE 1,
// HISTOGRAM 2).
type MetricType uint32

// The proxy-wasm metric types.
const (
	MetricCounter MetricType = iota
	MetricGauge
	MetricHistogram
)

// Metric is the value of a guest-defined metric, aggregated over every VM
// of the Host as Envoy aggregates a stat across workers
// (docs/ENVOY.md, Metrics).
type Metric struct {
	Type MetricType
	// Value is the counter or gauge value; for a histogram it is the
	// number of samples.
	Value int64
	// Samples are a histogram's recorded values, in order.
	Samples []uint64
}

// Status is where a stream stands after a phase was delivered to the
// filter.
type Status int

const (
	// Continue: the filter let the phase through; the next may run.
	Continue Status = iota
	// Paused: the filter stopped iteration (PAUSE from a headers callback
	// is StopAllIterationAndWatermark, from a body callback
	// StopIterationAndBuffer). Stream.Wait blocks until it resumes.
	Paused
	// Replied: the filter sent a local reply (Stream.LocalReply); the
	// request goes no further.
	Replied
	// Reset: the filter closed the stream (proxy_close_stream).
	Reset
)

// String returns e.g. "Paused".
func (s Status) String() string {
	switch s {
	case Continue:
		return "Continue"
	case Paused:
		return "Paused"
	case Replied:
		return "Replied"
	case Reset:
		return "Reset"
	}
	return "Status(" + strconv.FormatInt(int64(s), 10) + ")"
}

// Errors returned by the host. Check them with errors.Is.
var (
	// ErrNoABIVersion: the module exports none of proxy_abi_version_0_2_1,
	// _0_2_0 or _0_1_0 (CPPHOST WasmBase::load: "Missing or unknown
	// Proxy-Wasm ABI version").
	ErrNoABIVersion = errors.New("host: module exports no proxy-wasm ABI version marker")
	// ErrStartFailed: proxy_on_vm_start returned false.
	ErrStartFailed = errors.New("host: proxy_on_vm_start returned false")
	// ErrConfigureFailed: proxy_on_configure returned false (CPPHOST
	// canary: "Failed to configure base Wasm plugin").
	ErrConfigureFailed = errors.New("host: proxy_on_configure returned false")
	// ErrVMFailed: the VM trapped earlier; like Envoy, the host does not
	// call into a failed VM again.
	ErrVMFailed = errors.New("host: VM failed")
	// ErrClosed: the Host was closed.
	ErrClosed = errors.New("host: closed")
	// ErrStreamState: a stream operation was called out of order, e.g.
	// request body while the request is paused at headers, or after the
	// stream finished.
	ErrStreamState = errors.New("host: stream operation out of order")
)

// TrapError is returned when the guest traps: a Go panic that reached the
// runtime (proc_exit), an unreachable, or a hostcall made where Envoy
// forbids it (restricted_callback). The VM is failed afterwards.
type TrapError struct {
	// Worker is the worker index, or -1 for the canary VM.
	Worker int
	// Call is the export that was running, e.g. "proxy_on_request_headers".
	Call string
	// Err is wazero's error, with the guest stack trace when available.
	Err error
}

// Error returns e.g. "host: worker 0: proxy_on_tick trapped: ...".
func (e *TrapError) Error() string {
	w := "canary"
	if e.Worker >= 0 {
		w = "worker " + strconv.FormatInt(int64(e.Worker), 10)
	}
	return "host: " + w + ": " + e.Call + " trapped: " + e.Err.Error()
}

// Unwrap returns ErrVMFailed, so errors.Is(err, ErrVMFailed) holds.
func (e *TrapError) Unwrap() []error { return []error{ErrVMFailed, e.Err} }
