//go:build !wasip1

package proxywasm

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// EmulatorOptions configures NewEmulator.
type EmulatorOptions struct {
	// VMConfig is the VM configuration (buffer 6), readable during
	// VMContext.OnVMStart.
	VMConfig []byte
	// PluginConfig is the plugin configuration (buffer 7), readable during
	// PluginContext.OnPluginStart.
	PluginConfig []byte
	// Properties are the host properties served by proxy_get_property, keyed
	// by path with its segments joined by '.' ("source.address",
	// "xds.node.id", "plugin_name"); a requested path matches when its
	// segments joined by '.' equal the key. Values are the raw encoding
	// Envoy would send (strings raw, integers 8 bytes little-endian; see
	// GetProperty). They are visible to every context, before the active
	// stream's own filter state.
	Properties map[string]string
	// StartTime is the initial clock, in nanoseconds since the Unix epoch;
	// 0 means EmulatorDefaultTime.
	StartTime int64
	// LogLevel is what proxy_get_log_level answers; the zero value is
	// LogLevelTrace.
	LogLevel LogLevel
	// Log, if set, receives every proxy_log message; otherwise they are
	// discarded.
	Log func(level LogLevel, msg string)
	// Env is the VM's environment (Envoy's vm_config.environment_variables),
	// "NAME=value" entries in order, read by Getenv.
	Env []string
}

// EmulatorDefaultTime is the emulator's clock when EmulatorOptions.StartTime
// is 0: 2023-11-14T22:13:20Z in nanoseconds since the Unix epoch.
const EmulatorDefaultTime int64 = 1_700_000_000_000_000_000

// EmulatorRootContextID is the context id of the emulator's single root
// (plugin) context; streams get ids from 2 upwards, as in Envoy, where
// context ids are a per-VM counter starting at 1.
const EmulatorRootContextID uint32 = 1

// emulatorRetainedStreams is how many finished streams keep their state
// readable (LocalReply, ResponseHeaderMap, FilterState) before their
// storage is reused.
const emulatorRetainedStreams = 16

// Emulator is an in-memory proxy-wasm host for native (non-wasm) tests: it
// installs itself as this package's hostcall target and drives a
// types.VMContext through Envoy's callback sequences (docs/ENVOY.md,
// Lifecycle), so that plugin code runs unchanged outside the VM. It follows
// Envoy where the plugin can observe a difference: header keys are
// lower-cased, the single-value getter returns the first value, shared data
// has Envoy's cas rules, proxy_set_property writes filter state, metrics
// follow envoy context.cc. Maps other than the request and response headers
// (and, inside an HTTP call response, the call's headers) are NOT_FOUND.
//
// Once warm, the emulator allocates nothing per stream or per hostcall:
// its answers are views of its own reused storage, which the binding copies
// into buffers from proxy_on_memory_allocate, so testing.AllocsPerRun over
// a stream measures the plugin and the binding only. Accessors that build
// maps or slices for the test (Calls, FilterState, HTTPCalls) allocate.
//
// An Emulator is not safe for concurrent use, and only one can be installed
// at a time (the binding has one host, like a VM).
type Emulator struct {
	props    map[string][]byte
	vmConfig []byte
	plugin   []byte
	now      int64
	level    LogLevel
	logf     func(LogLevel, string)
	tick     uint32
	env      []string

	calls [numHostcalls]uint64

	// readable buffer while a callback that exposes one runs.
	buffers [BufferTypeForeignFunctionArgument + 1][]byte
	bufOpen [BufferTypeForeignFunctionArgument + 1]bool

	nextID    uint32
	effective uint32 // context the hostcalls act on
	streams   map[uint32]*emuStream
	free      []*emuStream
	retired   [emulatorRetainedStreams]*emuStream
	retiredN  int
	retiredAt int // index of the oldest retired stream

	shared  map[string]*emuShared
	nextCas uint32

	metrics   []emuMetric
	metricIDs [MetricTypeHistogram + 1]map[string]uint32

	nextToken   uint32
	pending     []EmulatorHTTPCall
	callResp    emuMap
	inCallResp  bool
	callRespMsg string

	pathBuf  []byte
	pairsBuf []byte
	closed   bool
}

// EmulatorHTTPCall is an HTTP call a plugin dispatched with
// proxy_http_call and the emulator has not answered yet.
type EmulatorHTTPCall struct {
	Token         uint32
	Cluster       string
	Headers       [][2]string
	Body          []byte
	Trailers      [][2]string
	TimeoutMillis uint32
}

type emuStream struct {
	id       uint32
	done     bool
	req      emuMap
	resp     emuMap
	state    emuMap // filter state by raw property path (without "wasm.")
	local    bool
	status   uint32
	grpc     int32
	details  []byte
	body     []byte
	localHdr emuMap
}

type emuShared struct {
	value []byte
	cas   uint32
}

type emuMetric struct {
	typ   MetricType
	name  string
	value uint64
}

// emuMap is a header map or key-value store kept in one reused byte
// buffer: entries are offsets into data. Removing leaves the bytes in
// data; reset reuses everything.
type emuMap struct {
	present bool
	data    []byte
	ents    []emuEntry
	view    [][2]string
}

type emuEntry struct{ k0, k1, v0, v1 int }

func (m *emuMap) reset() {
	m.present = false
	m.data = m.data[:0]
	m.ents = m.ents[:0]
}

func (m *emuMap) key(i int) string {
	e := m.ents[i]
	return bytesString(m.data[e.k0:e.k1])
}

func (m *emuMap) value(i int) []byte {
	e := m.ents[i]
	return m.data[e.v0:e.v1:e.v1]
}

// add appends (key, value), lower-casing ASCII letters of key if lower.
func (m *emuMap) add(key, value string, lower bool) {
	k0 := len(m.data)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if lower && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		m.data = append(m.data, c)
	}
	v0 := len(m.data)
	m.data = append(m.data, value...)
	m.ents = append(m.ents, emuEntry{k0, v0, v0, len(m.data)})
}

// find returns the index of the first entry whose key equals key (ASCII
// case-insensitively if fold), or -1.
func (m *emuMap) find(key string, fold bool) int {
	for i := range m.ents {
		k := m.key(i)
		if k == key || fold && asciiEqualFold(k, key) {
			return i
		}
	}
	return -1
}

func (m *emuMap) remove(key string, fold bool) {
	n := 0
	for i := range m.ents {
		k := m.key(i)
		if k == key || fold && asciiEqualFold(k, key) {
			continue
		}
		m.ents[n] = m.ents[i]
		n++
	}
	m.ents = m.ents[:n]
}

// set replaces every entry of key with one (key, value) at the end:
// Envoy's "remove, then add" for headers.
func (m *emuMap) set(key, value string, lower bool) {
	m.remove(key, lower)
	m.add(key, value, lower)
}

// put stores value under key in a map with unique keys (filter state),
// overwriting the old value in place when it is at least as long, so that
// rewriting a key does not grow the storage.
func (m *emuMap) put(key, value string) {
	if i := m.find(key, false); i >= 0 {
		if e := &m.ents[i]; e.v1-e.v0 >= len(value) {
			e.v1 = e.v0 + copy(m.data[e.v0:e.v1], value)
			return
		}
	}
	m.set(key, value, false)
}

// encode appends the map in the proxy-wasm pair serialization to dst.
func (m *emuMap) encode(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.ents)))
	for _, e := range m.ents {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(e.k1-e.k0))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(e.v1-e.v0))
	}
	for _, e := range m.ents {
		dst = append(dst, m.data[e.k0:e.k1]...)
		dst = append(dst, 0)
		dst = append(dst, m.data[e.v0:e.v1]...)
		dst = append(dst, 0)
	}
	return dst
}

// pairs returns the map as (key, value) views of its storage, in a reused
// slice.
func (m *emuMap) pairs() [][2]string {
	m.view = m.view[:0]
	for i := range m.ents {
		m.view = append(m.view, [2]string{m.key(i), bytesString(m.value(i))})
	}
	return m.view
}

// decodeInto replaces the content of m with the serialized map b, without
// allocating once m has grown. It reports false for a malformed map.
func (m *emuMap) decodeInto(b []byte, lower bool) bool {
	m.data, m.ents = m.data[:0], m.ents[:0]
	if len(b) <= 1 {
		return true
	}
	if len(b) < 4 {
		return false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > (len(b)-4)/8 {
		return false
	}
	off := 4 + 8*n
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		if kl > len(b) || vl > len(b) || off+kl+vl+2 > len(b) || b[off+kl] != 0 || b[off+kl+1+vl] != 0 {
			return false
		}
		m.add(bytesString(b[off:off+kl]), bytesString(b[off+kl+1:off+kl+1+vl]), lower)
		off += kl + vl + 2
	}
	return off == len(b)
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

var _ hostAPI = (*Emulator)(nil)

// Hostcall counters, by proxy-wasm import name.
const (
	hcLog = iota
	hcGetLogLevel
	hcGetCurrentTimeNanoseconds
	hcSetTickPeriodMilliseconds
	hcGetBufferBytes
	hcSetBufferBytes
	hcGetBufferStatus
	hcGetHeaderMapSize
	hcGetHeaderMapPairs
	hcSetHeaderMapPairs
	hcGetHeaderMapValue
	hcAddHeaderMapValue
	hcReplaceHeaderMapValue
	hcRemoveHeaderMapValue
	hcContinueStream
	hcCloseStream
	hcGetStatus
	hcSendLocalResponse
	hcHttpCall
	hcSetSharedData
	hcGetSharedData
	hcRegisterSharedQueue
	hcResolveSharedQueue
	hcEnqueueSharedQueue
	hcDequeueSharedQueue
	hcDefineMetric
	hcIncrementMetric
	hcRecordMetric
	hcGetMetric
	hcGetProperty
	hcSetProperty
	hcSetEffectiveContext
	hcDone
	numHostcalls
)

var hostcallNames = [numHostcalls]string{
	"proxy_log", "proxy_get_log_level", "proxy_get_current_time_nanoseconds",
	"proxy_set_tick_period_milliseconds", "proxy_get_buffer_bytes", "proxy_set_buffer_bytes",
	"proxy_get_buffer_status", "proxy_get_header_map_size", "proxy_get_header_map_pairs",
	"proxy_set_header_map_pairs", "proxy_get_header_map_value", "proxy_add_header_map_value",
	"proxy_replace_header_map_value", "proxy_remove_header_map_value", "proxy_continue_stream",
	"proxy_close_stream", "proxy_get_status", "proxy_send_local_response", "proxy_http_call",
	"proxy_set_shared_data", "proxy_get_shared_data", "proxy_register_shared_queue",
	"proxy_resolve_shared_queue", "proxy_enqueue_shared_queue", "proxy_dequeue_shared_queue",
	"proxy_define_metric", "proxy_increment_metric", "proxy_record_metric", "proxy_get_metric",
	"proxy_get_property", "proxy_set_property", "proxy_set_effective_context", "proxy_done",
}

// ErrEmulatorStart is returned by NewEmulator when proxy_on_vm_start
// answers false; ErrEmulatorConfigure when proxy_on_configure does.
var (
	ErrEmulatorStart     = errors.New("proxywasm: emulator: proxy_on_vm_start failed")
	ErrEmulatorConfigure = errors.New("proxywasm: emulator: proxy_on_configure failed")
)

// NewEmulator installs a new Emulator as the package's host, registers vm
// (SetVMContext) and runs Envoy's start sequence for root context
// EmulatorRootContextID: proxy_on_context_create(1, 0), proxy_on_vm_start
// with opts.VMConfig readable, proxy_on_configure with opts.PluginConfig
// readable. It returns the emulator with ErrEmulatorStart or
// ErrEmulatorConfigure if a step answers false (the emulator stays
// installed; Close it). Any previously installed emulator is replaced.
func NewEmulator(vm types.VMContext, opts EmulatorOptions) (*Emulator, error) {
	e := &Emulator{
		props:    make(map[string][]byte, len(opts.Properties)),
		vmConfig: opts.VMConfig,
		plugin:   opts.PluginConfig,
		now:      opts.StartTime,
		level:    opts.LogLevel,
		logf:     opts.Log,
		nextID:   EmulatorRootContextID + 1,
		streams:  map[uint32]*emuStream{},
		shared:   map[string]*emuShared{},
		nextCas:  1,
		env:      opts.Env,
	}
	if e.now == 0 {
		e.now = EmulatorDefaultTime
	}
	for k, v := range opts.Properties {
		e.props[k] = []byte(v)
	}
	for i := range e.metricIDs {
		e.metricIDs[i] = map[string]uint32{}
	}
	host = e
	hostLogLevel, hostLogLevelKnown = 0, false
	SetVMContext(vm)

	root := EmulatorRootContextID
	e.effective = root
	onContextCreate(root, 0)
	e.openBuffer(BufferTypeVMConfiguration, e.vmConfig)
	ok := onVMStart(root, uint32(len(e.vmConfig)))
	e.closeBuffer(BufferTypeVMConfiguration)
	if !ok {
		return e, ErrEmulatorStart
	}
	e.effective = root
	e.openBuffer(BufferTypePluginConfiguration, e.plugin)
	ok = onConfigure(root, uint32(len(e.plugin)))
	e.closeBuffer(BufferTypePluginConfiguration)
	if !ok {
		return e, ErrEmulatorConfigure
	}
	return e, nil
}

// Close uninstalls the emulator: the package's host answers UNIMPLEMENTED
// again and the VM context is cleared (SetVMContext(nil)). Closing twice,
// or an emulator that another one replaced, does nothing.
func (e *Emulator) Close() {
	if e.closed {
		return
	}
	e.closed = true
	if host == hostAPI(e) {
		host = unimplementedHost{}
		hostLogLevel, hostLogLevelKnown = 0, false
		SetVMContext(nil)
	}
}

func (e *Emulator) openBuffer(bt BufferType, b []byte) { e.buffers[bt], e.bufOpen[bt] = b, true }
func (e *Emulator) closeBuffer(bt BufferType)          { e.buffers[bt], e.bufOpen[bt] = nil, false }

// SetTime sets the clock that proxy_get_current_time_nanoseconds reads, in
// nanoseconds since the Unix epoch.
func (e *Emulator) SetTime(unixNanos int64) { e.now = unixNanos }

// Advance moves the clock forward by nanos nanoseconds (backward if
// negative).
func (e *Emulator) Advance(nanos int64) { e.now += nanos }

// Now returns the emulator's clock in nanoseconds since the Unix epoch.
func (e *Emulator) Now() int64 { return e.now }

// TickPeriodMillis returns the period the plugin last set with
// proxy_set_tick_period_milliseconds, in milliseconds (0: no ticks). The
// emulator never ticks by itself; call Tick.
func (e *Emulator) TickPeriodMillis() uint32 { return e.tick }

// Tick runs proxy_on_tick on the root context.
func (e *Emulator) Tick() {
	e.effective = EmulatorRootContextID
	onTick(EmulatorRootContextID)
}

// NewStream creates an HTTP stream under the root context with
// proxy_on_context_create and returns its context id. Its state (headers,
// local reply, filter state) lives until StreamDone and stays readable for
// the 16 most recently finished streams; after that its storage is reused.
func (e *Emulator) NewStream() uint32 {
	id := e.nextID
	e.nextID++
	var s *emuStream
	if n := len(e.free); n > 0 {
		s = e.free[n-1]
		e.free[n-1] = nil
		e.free = e.free[:n-1]
	} else {
		s = &emuStream{}
	}
	s.id, s.done, s.local = id, false, false
	s.status, s.grpc = 0, 0
	s.details, s.body = s.details[:0], s.body[:0]
	s.req.reset()
	s.resp.reset()
	s.state.reset()
	s.localHdr.reset()
	e.streams[id] = s
	e.effective = id
	onContextCreate(id, EmulatorRootContextID)
	return id
}

// RequestHeaders sets the request headers of stream id (keys lower-cased,
// order kept) and runs proxy_on_request_headers with their number. It
// returns the plugin's action as the plugin returned it (Envoy forces stop
// after a local reply, whatever the plugin returns); an unknown stream is
// ActionContinue without a callback.
func (e *Emulator) RequestHeaders(id uint32, headers [][2]string, endOfStream bool) types.Action {
	s := e.streams[id]
	if s == nil || s.done {
		return types.ActionContinue
	}
	s.req.reset()
	s.req.present = true
	for i := range headers {
		s.req.add(headers[i][0], headers[i][1], true)
	}
	e.effective = id
	return onRequestHeaders(id, uint32(len(headers)), endOfStream)
}

// ResponseHeaders sets the response headers of stream id, as
// RequestHeaders, and runs proxy_on_response_headers. Until it is called
// the response header map does not exist (NOT_FOUND).
func (e *Emulator) ResponseHeaders(id uint32, headers [][2]string, endOfStream bool) types.Action {
	s := e.streams[id]
	if s == nil || s.done {
		return types.ActionContinue
	}
	s.resp.reset()
	s.resp.present = true
	for i := range headers {
		s.resp.add(headers[i][0], headers[i][1], true)
	}
	e.effective = id
	return onResponseHeaders(id, uint32(len(headers)), endOfStream)
}

// StreamDone ends stream id as Envoy ends it for this module: proxy_on_delete
// (Envoy's HTTP order is proxy_on_log, proxy_on_done, proxy_on_delete, and
// the module exports only the last; docs/ENVOY.md, Lifecycle). The stream's
// state stays readable until 16 more streams have finished.
func (e *Emulator) StreamDone(id uint32) {
	s := e.streams[id]
	if s == nil || s.done {
		return
	}
	e.effective = id
	onDelete(id)
	s.done = true
	if e.retiredN == emulatorRetainedStreams {
		old := e.retired[e.retiredAt]
		delete(e.streams, old.id)
		e.free = append(e.free, old)
		e.retired[e.retiredAt] = s
		e.retiredAt = (e.retiredAt + 1) % emulatorRetainedStreams
	} else {
		e.retired[(e.retiredAt+e.retiredN)%emulatorRetainedStreams] = s
		e.retiredN++
	}
	e.effective = EmulatorRootContextID
}

// LocalReply returns the local reply the plugin sent on stream id with
// proxy_send_local_response: HTTP status, body and headers (keys
// lower-cased), and ok false if it sent none or the stream is unknown. The
// body and header strings are views of the emulator's storage, valid until
// the stream's storage is reused (see NewStream); copy what must live
// longer.
func (e *Emulator) LocalReply(id uint32) (status uint32, body []byte, headers [][2]string, ok bool) {
	s := e.streams[id]
	if s == nil || !s.local {
		return 0, nil, nil, false
	}
	return s.status, s.body, s.localHdr.pairs(), true
}

// LocalReplyDetails returns the response code details and gRPC status of
// stream id's local reply (-1 or any value outside 0..16: none), and ok
// false if it sent none.
func (e *Emulator) LocalReplyDetails(id uint32) (details string, grpcStatus int32, ok bool) {
	s := e.streams[id]
	if s == nil || !s.local {
		return "", 0, false
	}
	return bytesString(s.details), s.grpc, true
}

// ResponseHeaderMap returns the response headers of stream id as the
// plugin left them (after its additions and removals), as views valid
// until the stream's storage is reused; nil if the stream is unknown or
// had no response headers.
func (e *Emulator) ResponseHeaderMap(id uint32) [][2]string {
	s := e.streams[id]
	if s == nil || !s.resp.present {
		return nil
	}
	return s.resp.pairs()
}

// FilterState returns the properties the plugin wrote on stream id with
// proxy_set_property, under the filter-state names Envoy gives them
// ("wasm." + the raw path, docs/ENVOY.md, Properties and filter state), as
// a new map of copies; nil if the stream is unknown.
func (e *Emulator) FilterState(id uint32) map[string]string {
	s := e.streams[id]
	if s == nil {
		return nil
	}
	m := make(map[string]string, len(s.state.ents))
	for i := range s.state.ents {
		m["wasm."+s.state.key(i)] = string(s.state.value(i))
	}
	return m
}

// SharedData returns a copy of the shared-data value of key and its cas,
// or ok false if the key was never set.
func (e *Emulator) SharedData(key string) (value []byte, cas uint32, ok bool) {
	d := e.shared[key]
	if d == nil {
		return nil, 0, false
	}
	return append([]byte(nil), d.value...), d.cas, true
}

// SetSharedData writes key unconditionally, as another worker would, and
// returns the new cas.
func (e *Emulator) SetSharedData(key string, value []byte) uint32 {
	e.storeShared(key, value, 0)
	return e.shared[key].cas
}

// Metric returns the value of the metric the plugin defined as name (any
// type; the Envoy stat is "wasmcustom." + name), and ok false if none.
func (e *Emulator) Metric(name string) (value uint64, ok bool) {
	for _, ids := range e.metricIDs {
		if id, found := ids[name]; found {
			return e.metrics[id>>2-1].value, true
		}
	}
	return 0, false
}

// HTTPCalls returns copies of the HTTP calls dispatched and not yet
// answered, oldest first.
func (e *Emulator) HTTPCalls() []EmulatorHTTPCall {
	return append([]EmulatorHTTPCall(nil), e.pending...)
}

// RespondHTTPCall answers the pending call token: during
// proxy_on_http_call_response on the root context, maps 6 (headers, which
// should include ":status") and buffer 4 (body) hold the response. With
// headers nil the call fails as a reset (numHeaders 0; proxy_get_status:
// 11, "reset"). It reports false for an unknown token.
func (e *Emulator) RespondHTTPCall(token uint32, headers [][2]string, body []byte) bool {
	i := -1
	for j := range e.pending {
		if e.pending[j].Token == token {
			i = j
		}
	}
	if i < 0 {
		return false
	}
	e.pending = append(e.pending[:i], e.pending[i+1:]...)
	e.callResp.reset()
	e.callResp.present = true
	for _, h := range headers {
		e.callResp.add(h[0], h[1], true)
	}
	e.inCallResp = true
	e.callRespMsg = ""
	if headers == nil {
		e.callRespMsg = "reset"
	}
	e.openBuffer(BufferTypeHttpCallResponseBody, body)
	e.effective = EmulatorRootContextID
	onHttpCallResponse(EmulatorRootContextID, token, uint32(len(headers)), uint32(len(body)), 0)
	e.closeBuffer(BufferTypeHttpCallResponseBody)
	e.inCallResp = false
	e.callResp.reset()
	e.effective = EmulatorRootContextID
	return true
}

// Calls returns how many times each hostcall was made since the emulator
// was created or ResetCalls, by proxy-wasm import name
// ("proxy_get_header_map_value", "proxy_get_current_time_nanoseconds",
// ...); hostcalls never made are absent.
func (e *Emulator) Calls() map[string]uint64 {
	m := map[string]uint64{}
	for i, n := range e.calls {
		if n > 0 {
			m[hostcallNames[i]] = n
		}
	}
	return m
}

// ResetCalls sets every hostcall count to 0.
func (e *Emulator) ResetCalls() { e.calls = [numHostcalls]uint64{} }

// stream returns the stream the hostcalls act on, or nil on the root.
func (e *Emulator) stream() *emuStream {
	if e.effective == EmulatorRootContextID {
		return nil
	}
	s := e.streams[e.effective]
	if s == nil || s.done {
		return nil
	}
	return s
}

func (e *Emulator) headerMap(mt MapType) *emuMap {
	switch mt {
	case MapTypeHttpRequestHeaders, MapTypeHttpResponseHeaders:
		s := e.stream()
		if s == nil {
			return nil
		}
		m := &s.req
		if mt == MapTypeHttpResponseHeaders {
			m = &s.resp
		}
		if !m.present {
			return nil
		}
		return m
	case MapTypeHttpCallResponseHeaders:
		if e.inCallResp {
			return &e.callResp
		}
	}
	return nil
}

// The hostAPI methods.

func (e *Emulator) log(level LogLevel, msg string) status {
	e.calls[hcLog]++
	if e.logf != nil {
		e.logf(level, msg)
	}
	return statusOK
}

func (e *Emulator) getLogLevel() (LogLevel, status) {
	e.calls[hcGetLogLevel]++
	return e.level, statusOK
}

func (e *Emulator) getCurrentTimeNanoseconds() (uint64, status) {
	e.calls[hcGetCurrentTimeNanoseconds]++
	return uint64(e.now), statusOK
}

func (e *Emulator) setTickPeriodMilliseconds(periodMillis uint32) status {
	e.calls[hcSetTickPeriodMilliseconds]++
	e.tick = periodMillis
	return statusOK
}

func (e *Emulator) getBufferBytes(bt BufferType, start, maxSize uint32) ([]byte, status) {
	e.calls[hcGetBufferBytes]++
	if bt >= BufferType(len(e.bufOpen)) || !e.bufOpen[bt] {
		return nil, statusNotFound
	}
	b := e.buffers[bt]
	if start >= uint32(len(b)) {
		return nil, statusOK
	}
	end := uint64(start) + uint64(maxSize)
	if end > uint64(len(b)) {
		end = uint64(len(b))
	}
	return b[start:end], statusOK
}

func (e *Emulator) setBufferBytes(BufferType, uint32, uint32, []byte) status {
	e.calls[hcSetBufferBytes]++
	return statusNotFound
}

func (e *Emulator) getBufferStatus(bt BufferType) (uint32, uint32, status) {
	e.calls[hcGetBufferStatus]++
	if bt >= BufferType(len(e.bufOpen)) || !e.bufOpen[bt] {
		return 0, 0, statusNotFound
	}
	return uint32(len(e.buffers[bt])), 0, statusOK
}

func (e *Emulator) getHeaderMapSize(mt MapType) (uint32, status) {
	e.calls[hcGetHeaderMapSize]++
	m := e.headerMap(mt)
	if m == nil {
		return 0, statusNotFound
	}
	e.pairsBuf = m.encode(e.pairsBuf[:0])
	return uint32(len(e.pairsBuf)), statusOK
}

func (e *Emulator) getHeaderMapPairs(mt MapType) ([]byte, status) {
	e.calls[hcGetHeaderMapPairs]++
	m := e.headerMap(mt)
	if m == nil {
		return nil, statusNotFound
	}
	if len(m.ents) == 0 {
		return nil, statusOK // Envoy: pointer 0, size 0
	}
	e.pairsBuf = m.encode(e.pairsBuf[:0])
	return e.pairsBuf, statusOK
}

func (e *Emulator) setHeaderMapPairs(mt MapType, data []byte) status {
	e.calls[hcSetHeaderMapPairs]++
	m := e.headerMap(mt)
	if m == nil || mt == MapTypeHttpCallResponseHeaders {
		return statusNotFound
	}
	if !m.decodeInto(data, true) {
		m.data, m.ents = m.data[:0], m.ents[:0] // cpp-host: malformed is empty
	}
	return statusOK
}

func (e *Emulator) getHeaderMapValue(mt MapType, key string) ([]byte, status) {
	e.calls[hcGetHeaderMapValue]++
	m := e.headerMap(mt)
	if m == nil {
		return nil, statusNotFound
	}
	i := m.find(key, true)
	if i < 0 {
		return nil, statusNotFound
	}
	return m.value(i), statusOK
}

func (e *Emulator) addHeaderMapValue(mt MapType, key, value string) status {
	e.calls[hcAddHeaderMapValue]++
	m := e.headerMap(mt)
	if m == nil || mt == MapTypeHttpCallResponseHeaders {
		return statusNotFound
	}
	m.add(key, value, true)
	return statusOK
}

func (e *Emulator) replaceHeaderMapValue(mt MapType, key, value string) status {
	e.calls[hcReplaceHeaderMapValue]++
	m := e.headerMap(mt)
	if m == nil || mt == MapTypeHttpCallResponseHeaders {
		return statusNotFound
	}
	m.set(key, value, true)
	return statusOK
}

func (e *Emulator) removeHeaderMapValue(mt MapType, key string) status {
	e.calls[hcRemoveHeaderMapValue]++
	m := e.headerMap(mt)
	if m == nil || mt == MapTypeHttpCallResponseHeaders {
		return statusNotFound
	}
	m.remove(key, true)
	return statusOK
}

func (e *Emulator) continueStream(st StreamType) status {
	e.calls[hcContinueStream]++
	if st == StreamTypeUpstream {
		return statusUnimplemented
	}
	return statusOK
}

func (e *Emulator) closeStream(StreamType) status {
	e.calls[hcCloseStream]++
	return statusOK
}

func (e *Emulator) getStatus() (uint32, []byte, status) {
	e.calls[hcGetStatus]++
	if e.callRespMsg != "" {
		return uint32(statusBrokenConnection), []byte(e.callRespMsg), statusOK
	}
	return 0, nil, statusOK
}

func (e *Emulator) sendLocalResponse(statusCode uint32, details string, body, headers []byte, grpcStatus int32) status {
	e.calls[hcSendLocalResponse]++
	s := e.stream()
	if s == nil {
		return statusOK // Envoy: silently nothing without a stream
	}
	if !s.localHdr.decodeInto(headers, true) {
		return statusBadArgument
	}
	s.local = true
	s.status, s.grpc = statusCode, grpcStatus
	s.details = append(s.details[:0], details...)
	s.body = append(s.body[:0], body...)
	return statusOK
}

func (e *Emulator) httpCall(upstream string, headers, body, trailers []byte, timeoutMillis uint32) (uint32, status) {
	e.calls[hcHttpCall]++
	var hm, tm emuMap
	if !hm.decodeInto(headers, false) || !tm.decodeInto(trailers, false) {
		return 0, statusBadArgument
	}
	for _, p := range []string{":method", ":path", ":authority"} {
		if hm.find(p, false) < 0 {
			return 0, statusBadArgument
		}
	}
	e.nextToken++
	e.pending = append(e.pending, EmulatorHTTPCall{
		Token:         e.nextToken,
		Cluster:       strings.Clone(upstream),
		Headers:       clonePairs(hm.pairs()),
		Body:          append([]byte(nil), body...),
		Trailers:      clonePairs(tm.pairs()),
		TimeoutMillis: timeoutMillis,
	})
	return e.nextToken, statusOK
}

func clonePairs(ps [][2]string) [][2]string {
	if len(ps) == 0 {
		return nil
	}
	out := make([][2]string, len(ps))
	for i, p := range ps {
		out[i] = [2]string{strings.Clone(p[0]), strings.Clone(p[1])}
	}
	return out
}

// setSharedData follows cpp-host src/shared_data.cc SharedData::set: a
// stale non-zero cas on an existing key is CAS_MISMATCH, a new key is
// created whatever the cas, and every write takes the next value of one
// counter shared by all keys (starting at 1, skipping 0).
func (e *Emulator) setSharedData(key string, value []byte, cas uint32) status {
	e.calls[hcSetSharedData]++
	return e.storeShared(key, value, cas)
}

func (e *Emulator) storeShared(key string, value []byte, cas uint32) status {
	d := e.shared[key]
	if d != nil && cas != 0 && cas != d.cas {
		return statusCasMismatch
	}
	if d == nil {
		d = &emuShared{}
		e.shared[strings.Clone(key)] = d
	}
	d.value = append(d.value[:0], value...)
	d.cas = e.nextCas
	e.nextCas++
	if e.nextCas == 0 {
		e.nextCas = 1
	}
	return statusOK
}

func (e *Emulator) getSharedData(key string) ([]byte, uint32, status) {
	e.calls[hcGetSharedData]++
	d := e.shared[key]
	if d == nil {
		return nil, 0, statusNotFound
	}
	return d.value, d.cas, statusOK
}

func (e *Emulator) registerSharedQueue(string) (uint32, status) {
	e.calls[hcRegisterSharedQueue]++
	return 0, statusUnimplemented
}

func (e *Emulator) resolveSharedQueue(string, string) (uint32, status) {
	e.calls[hcResolveSharedQueue]++
	return 0, statusUnimplemented
}

func (e *Emulator) enqueueSharedQueue(uint32, []byte) status {
	e.calls[hcEnqueueSharedQueue]++
	return statusUnimplemented
}

func (e *Emulator) dequeueSharedQueue(uint32) ([]byte, status) {
	e.calls[hcDequeueSharedQueue]++
	return nil, statusUnimplemented
}

// defineMetric returns the id of name for its type, creating it at 0. Ids
// carry the type in their two low bits, as Envoy's do.
func (e *Emulator) defineMetric(mt MetricType, name string) (uint32, status) {
	e.calls[hcDefineMetric]++
	if mt > MetricTypeHistogram {
		return 0, statusBadArgument
	}
	if id, ok := e.metricIDs[mt][name]; ok {
		return id, statusOK
	}
	e.metrics = append(e.metrics, emuMetric{typ: mt, name: strings.Clone(name)})
	id := uint32(len(e.metrics))<<2 | uint32(mt)
	e.metricIDs[mt][e.metrics[len(e.metrics)-1].name] = id
	return id, statusOK
}

func (e *Emulator) metric(id uint32) *emuMetric {
	i := int(id>>2) - 1
	if i < 0 || i >= len(e.metrics) || uint32(e.metrics[i].typ) != id&3 {
		return nil
	}
	return &e.metrics[i]
}

func (e *Emulator) incrementMetric(id uint32, delta int64) status {
	e.calls[hcIncrementMetric]++
	m := e.metric(id)
	switch {
	case m == nil:
		return statusNotFound
	case m.typ == MetricTypeCounter && delta <= 0, m.typ == MetricTypeHistogram:
		return statusBadArgument
	}
	m.value += uint64(delta)
	return statusOK
}

func (e *Emulator) recordMetric(id uint32, value uint64) status {
	e.calls[hcRecordMetric]++
	m := e.metric(id)
	switch {
	case m == nil:
		return statusNotFound
	case m.typ == MetricTypeCounter:
		m.value += value
	default: // gauge: set; histogram: the last sample
		m.value = value
	}
	return statusOK
}

func (e *Emulator) getMetric(id uint32) (uint64, status) {
	e.calls[hcGetMetric]++
	m := e.metric(id)
	switch {
	case m == nil:
		return 0, statusNotFound
	case m.typ == MetricTypeHistogram:
		return 0, statusBadArgument
	}
	return m.value, statusOK
}

// getProperty looks path up in EmulatorOptions.Properties (segments joined
// by '.'), then in the stream's filter state (raw path), as Envoy resolves
// attributes before filter state "wasm.<path>".
func (e *Emulator) getProperty(path []byte) ([]byte, status) {
	e.calls[hcGetProperty]++
	e.pathBuf = append(e.pathBuf[:0], path...)
	for i, c := range e.pathBuf {
		if c == 0 {
			e.pathBuf[i] = '.'
		}
	}
	if v, ok := e.props[string(e.pathBuf)]; ok {
		return v, statusOK
	}
	if s := e.stream(); s != nil {
		if i := s.state.find(bytesString(path), false); i >= 0 {
			return s.state.value(i), statusOK
		}
	}
	return nil, statusNotFound
}

func (e *Emulator) setProperty(path, value []byte) status {
	e.calls[hcSetProperty]++
	s := e.stream()
	if s == nil {
		return statusNotFound // Envoy: a root context has no stream info
	}
	s.state.put(bytesString(path), bytesString(value))
	return statusOK
}

func (e *Emulator) setEffectiveContext(contextID uint32) status {
	e.calls[hcSetEffectiveContext]++
	if contextID != EmulatorRootContextID {
		if s := e.streams[contextID]; s == nil || s.done {
			return statusBadArgument
		}
	}
	e.effective = contextID
	return statusOK
}

func (e *Emulator) done() status {
	e.calls[hcDone]++
	return statusNotFound
}

// LeastHeapAllocs returns the Go heap allocations (runtime.MemStats.Mallocs)
// of runs calls of f, for tests that a warm path allocates nothing. It
// calls f once first (warm-up) and runs with GOMAXPROCS 1. The runtime
// itself allocates now and then (about one measurement in thirty sees two
// allocations whatever f does), so it measures up to three times and
// returns the smallest total: an allocation in f shows in every
// measurement. testing.AllocsPerRun rounds the average down, so it cannot
// tell 999 allocations in 1000 runs from none.
func LeastHeapAllocs(runs int, f func()) uint64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	least := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			f()
		}
		runtime.ReadMemStats(&after)
		least = min(least, after.Mallocs-before.Mallocs)
		if least == 0 {
			break
		}
	}
	return least
}
