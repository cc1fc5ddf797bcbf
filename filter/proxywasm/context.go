package proxywasm

import (
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// The context registry. Context ids come from the host (spec v0.2.1
// "proxy_on_context_create"; Envoy starts at 1 per VM): a context created
// with parent 0 is a root (plugin) context, any other is a stream whose
// parent is its root. One VM runs one callback at a time, so plain maps
// suffice.
var (
	vmContext  types.VMContext
	roots      = map[uint32]*rootContext{}
	tcpStreams = map[uint32]*tcpStream{}

	// activeContextID is the context the running callback belongs to, or
	// the one named by the last SetEffectiveContext. It decides which root
	// context owns an HTTP callout, as Envoy's contextOrEffectiveContext().
	activeContextID uint32

	// lastRoot caches roots[lastRootID]: every stream's creation looks up
	// its root, and a VM that serves one plugin (one filter in the chain)
	// has one root, so there a hit skips the map's hashing. With several
	// plugins in one VM, streams alternate between roots and most look ups
	// go to the map as before.
	lastRootID uint32
	lastRoot   *rootContext
)

// rootOf returns root context id, or nil if it is unknown.
func rootOf(id uint32) *rootContext {
	if lastRoot != nil && lastRootID == id {
		return lastRoot
	}
	r := roots[id]
	if r != nil {
		lastRootID, lastRoot = id, r
	}
	return r
}

type rootContext struct {
	plugin   types.PluginContext
	callouts map[uint32]callout // by proxy_http_call token
}

// callout is a pending proxy_http_call: the callback and the stream it was
// dispatched from (0 for a root context).
type callout struct {
	callback func(numHeaders, bodySize, numTrailers int)
	streamID uint32
}

type httpStream struct {
	ctx    types.HttpContext
	id     uint32
	rootID uint32
}

// The HTTP stream registry: a direct-mapped table, with a map for the
// streams it cannot place. Every callback of a stream looks it up, so the
// common case is an index and a compare, no hashing: Envoy numbers a VM's
// contexts from one counter (cpp-host WasmBase::allocContextId), so up to
// streamSlots streams in flight each find their own slot.
const streamSlots = 1024

var (
	// streamTable holds a stream at slot id % streamSlots.
	streamTable [streamSlots]*httpStream
	// streamSpill holds the streams whose slot another stream holds.
	streamSpill = map[uint32]*httpStream{}
)

// httpStreamOf returns the live HTTP stream id, or nil.
func httpStreamOf(id uint32) *httpStream {
	if s := streamTable[id%streamSlots]; s != nil && s.id == id {
		return s
	}
	if len(streamSpill) == 0 {
		return nil
	}
	return streamSpill[id]
}

// putHTTPStream registers s under its id.
func putHTTPStream(s *httpStream) {
	slot := &streamTable[s.id%streamSlots]
	if *slot == nil || (*slot).id == s.id {
		*slot = s
		return
	}
	streamSpill[s.id] = s
}

// dropHTTPStream forgets stream id and returns it (nil if unknown).
func dropHTTPStream(id uint32) *httpStream {
	slot := &streamTable[id%streamSlots]
	if s := *slot; s != nil && s.id == id {
		*slot = nil
		return s
	}
	s, ok := streamSpill[id]
	if !ok {
		return nil
	}
	delete(streamSpill, id)
	return s
}

// liveHTTPStreams counts the registered HTTP streams (for tests).
func liveHTTPStreams() int {
	n := len(streamSpill)
	for _, s := range streamTable {
		if s != nil {
			n++
		}
	}
	return n
}

// freeHTTPStreams holds httpStream records of deleted streams for reuse, so
// that a new stream allocates nothing in the binding once warm. At most
// maxFreeHTTPStreams are kept.
var freeHTTPStreams []*httpStream

const maxFreeHTTPStreams = 1024

func newHTTPStream(ctx types.HttpContext, id, rootID uint32) *httpStream {
	if n := len(freeHTTPStreams); n > 0 {
		s := freeHTTPStreams[n-1]
		freeHTTPStreams[n-1] = nil
		freeHTTPStreams = freeHTTPStreams[:n-1]
		*s = httpStream{ctx: ctx, id: id, rootID: rootID}
		return s
	}
	return &httpStream{ctx: ctx, id: id, rootID: rootID}
}

// recycleHTTPStream returns a deleted stream's record to the free list,
// dropping its reference to the plugin's context.
func recycleHTTPStream(s *httpStream) {
	*s = httpStream{}
	if len(freeHTTPStreams) < maxFreeHTTPStreams {
		freeHTTPStreams = append(freeHTTPStreams, s)
	}
}

type tcpStream struct {
	ctx    types.TcpContext
	rootID uint32
}

// SetVMContext registers the plugin's VM context. Call it exactly once, from
// an init function of package main: a c-shared module never runs main.
// While _initialize runs, Envoy allows only the proxy_log hostcall (fact
// sheet §0.1), so SetVMContext makes no hostcall and the VMContext
// constructor must not make any other than logging.
//
// Every later root context is created with vm.NewPluginContext, and every
// stream with the root's NewHttpContext or, if that returns nil,
// NewTcpContext.
func SetVMContext(vm types.VMContext) {
	vmContext = vm
	clear(roots)
	lastRootID, lastRoot = 0, nil
	clear(streamTable[:])
	clear(streamSpill)
	clear(tcpStreams)
	activeContextID = 0
}

// rootIDOf returns the root context id that owns context id, and whether
// id is known.
func rootIDOf(id uint32) (uint32, bool) {
	if s := httpStreamOf(id); s != nil {
		return s.rootID, true
	}
	if _, ok := roots[id]; ok {
		return id, true
	}
	if s, ok := tcpStreams[id]; ok {
		return s.rootID, true
	}
	return 0, false
}

// onContextCreate implements proxy_on_context_create(context_id,
// parent_context_id) (spec v0.2.1 "Contexts").
func onContextCreate(id, parentID uint32) {
	activeContextID = id
	callbackName = "proxy_on_context_create"
	defer endCallback()
	if parentID == 0 {
		if vmContext == nil {
			logAlways(LogLevelError, "proxywasm: proxy_on_context_create: no VMContext; call SetVMContext from init")
			return
		}
		p := vmContext.NewPluginContext(id)
		if p == nil {
			logAlways(LogLevelError, "proxywasm: NewPluginContext returned nil; root context "+strconv.FormatUint(uint64(id), 10)+" ignored")
			return
		}
		roots[id] = &rootContext{plugin: p}
		if lastRootID == id {
			lastRootID, lastRoot = 0, nil
		}
		return
	}
	root := rootOf(parentID)
	if root == nil {
		logAlways(LogLevelError, "proxywasm: proxy_on_context_create: unknown root context "+strconv.FormatUint(uint64(parentID), 10)+" for context "+strconv.FormatUint(uint64(id), 10))
		return
	}
	if hc := root.plugin.NewHttpContext(id); hc != nil {
		putHTTPStream(newHTTPStream(hc, id, parentID))
		return
	}
	if tc := root.plugin.NewTcpContext(id); tc != nil {
		tcpStreams[id] = &tcpStream{ctx: tc, rootID: parentID}
		return
	}
	LogDebug("proxywasm: plugin created no stream context for " + strconv.FormatUint(uint64(id), 10) + "; its callbacks will continue")
}

// onVMStart implements proxy_on_vm_start(root_context_id,
// vm_configuration_size) (spec v0.2.1 "Lifecycle"; Envoy passes the root
// id, which the spec calls unused). A missing VMContext fails the start.
func onVMStart(rootID, vmConfigurationSize uint32) (ok bool) {
	activeContextID = rootID
	refreshLogLevel()
	ok = true
	callbackName = "proxy_on_vm_start"
	defer endCallback()
	if vmContext == nil {
		logAlways(LogLevelError, "proxywasm: proxy_on_vm_start: no VMContext; call SetVMContext from init")
		return false
	}
	return bool(vmContext.OnVMStart(int(vmConfigurationSize)))
}

// onConfigure implements proxy_on_configure(root_context_id,
// plugin_configuration_size) (spec v0.2.1 "Configuration"). An unknown root
// context fails configuration.
func onConfigure(rootID, pluginConfigurationSize uint32) (ok bool) {
	activeContextID = rootID
	refreshLogLevel()
	ok = true
	callbackName = "proxy_on_configure"
	defer endCallback()
	root, known := roots[rootID]
	if !known {
		logAlways(LogLevelError, "proxywasm: proxy_on_configure: unknown root context "+strconv.FormatUint(uint64(rootID), 10))
		return false
	}
	return bool(root.plugin.OnPluginStart(int(pluginConfigurationSize)))
}

// onTick implements proxy_on_tick(root_context_id) (spec v0.2.1 "Timers").
// It also refreshes the cached log level.
func onTick(rootID uint32) {
	activeContextID = rootID
	refreshLogLevel()
	callbackName = "proxy_on_tick"
	defer endCallback()
	if root, ok := roots[rootID]; ok {
		root.plugin.OnTick()
	}
}

// onQueueReady implements proxy_on_queue_ready(root_context_id, queue_id)
// (spec v0.2.1 "Shared queues").
func onQueueReady(rootID, queueID uint32) {
	activeContextID = rootID
	callbackName = "proxy_on_queue_ready"
	defer endCallback()
	if root, ok := roots[rootID]; ok {
		root.plugin.OnQueueReady(queueID)
	}
}

// httpCallback runs f on the HTTP stream id, failing open (continue) when
// the stream is unknown or f panics.
func httpCallback(where string, id uint32, f func(types.HttpContext) types.Action) (a types.Action) {
	activeContextID = id
	a = types.ActionContinue
	callbackName = where
	defer endCallback()
	if s := httpStreamOf(id); s != nil {
		a = f(s.ctx)
	}
	return a
}

// tcpCallback is httpCallback for TCP streams.
func tcpCallback(where string, id uint32, f func(types.TcpContext) types.Action) (a types.Action) {
	activeContextID = id
	a = types.ActionContinue
	callbackName = where
	defer endCallback()
	if s, ok := tcpStreams[id]; ok {
		a = f(s.ctx)
	}
	return a
}

// onRequestHeaders implements proxy_on_request_headers(context_id,
// num_headers, end_of_stream) (spec v0.2.1 "HTTP fields").
func onRequestHeaders(id, numHeaders uint32, endOfStream bool) types.Action {
	return httpCallback("proxy_on_request_headers", id, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestHeaders(int(numHeaders), endOfStream)
	})
}

// The Dispatch functions below serve the body, trailer and TCP callbacks.
// This package does not export those callbacks from the module (see
// abi_exports_wasip1.go); package streamexports does, by calling these, for
// modules that import it. Each recovers a panic, fails open (Continue), and
// returns Continue for an unknown context id. Plugins do not call them.

// DispatchRequestBody implements proxy_on_request_body(context_id, body_size,
// end_of_stream); body_size is the buffered size in bytes.
func DispatchRequestBody(id, bodySize uint32, endOfStream bool) types.Action {
	return httpCallback("proxy_on_request_body", id, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestBody(int(bodySize), endOfStream)
	})
}

// DispatchRequestTrailers implements proxy_on_request_trailers(context_id,
// num_trailers).
func DispatchRequestTrailers(id, numTrailers uint32) types.Action {
	return httpCallback("proxy_on_request_trailers", id, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestTrailers(int(numTrailers))
	})
}

// onResponseHeaders implements proxy_on_response_headers(context_id,
// num_headers, end_of_stream).
func onResponseHeaders(id, numHeaders uint32, endOfStream bool) types.Action {
	return httpCallback("proxy_on_response_headers", id, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseHeaders(int(numHeaders), endOfStream)
	})
}

// DispatchResponseBody implements proxy_on_response_body(context_id, body_size,
// end_of_stream).
func DispatchResponseBody(id, bodySize uint32, endOfStream bool) types.Action {
	return httpCallback("proxy_on_response_body", id, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseBody(int(bodySize), endOfStream)
	})
}

// DispatchResponseTrailers implements proxy_on_response_trailers(context_id,
// num_trailers).
func DispatchResponseTrailers(id, numTrailers uint32) types.Action {
	return httpCallback("proxy_on_response_trailers", id, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseTrailers(int(numTrailers))
	})
}

// DispatchNewConnection implements proxy_on_new_connection(context_id) (spec
// v0.2.1 "TCP/UDP/QUIC stream").
func DispatchNewConnection(id uint32) types.Action {
	return tcpCallback("proxy_on_new_connection", id, func(t types.TcpContext) types.Action {
		return t.OnNewConnection()
	})
}

// DispatchDownstreamData implements proxy_on_downstream_data(context_id,
// data_size, end_of_stream).
func DispatchDownstreamData(id, dataSize uint32, endOfStream bool) types.Action {
	return tcpCallback("proxy_on_downstream_data", id, func(t types.TcpContext) types.Action {
		return t.OnDownstreamData(int(dataSize), endOfStream)
	})
}

// DispatchUpstreamData implements proxy_on_upstream_data(context_id, data_size,
// end_of_stream).
func DispatchUpstreamData(id, dataSize uint32, endOfStream bool) types.Action {
	return tcpCallback("proxy_on_upstream_data", id, func(t types.TcpContext) types.Action {
		return t.OnUpstreamData(int(dataSize), endOfStream)
	})
}

// DispatchDownstreamConnectionClose implements
// proxy_on_downstream_connection_close(context_id, peer_type).
func DispatchDownstreamConnectionClose(id, peerType uint32) {
	tcpCallback("proxy_on_downstream_connection_close", id, func(t types.TcpContext) types.Action {
		t.OnDownstreamClose(types.PeerType(peerType))
		return types.ActionContinue
	})
}

// DispatchUpstreamConnectionClose implements
// proxy_on_upstream_connection_close(context_id, peer_type).
func DispatchUpstreamConnectionClose(id, peerType uint32) {
	tcpCallback("proxy_on_upstream_connection_close", id, func(t types.TcpContext) types.Action {
		t.OnUpstreamClose(types.PeerType(peerType))
		return types.ActionContinue
	})
}

// onDelete implements proxy_on_delete(context_id) (spec v0.2.1
// "Contexts"), the last callback of every context; the module exports
// neither proxy_on_log nor proxy_on_done (abi_exports_wasip1.go). For a root
// context it runs PluginContext.OnPluginDone, whose result is ignored
// (without on_done exported the host deletes the root at once, so it
// cannot be deferred), and forgets the context with its pending HTTP
// callouts. For a stream it runs the stream-done callback
// (HttpContext.OnHttpStreamDone or TcpContext.OnStreamDone), exactly once.
// Shared data, the clock and metrics are usable here; the stream's headers
// and properties are not to be relied on.
func onDelete(id uint32) {
	activeContextID = id
	callbackName = "proxy_on_delete"
	defer endCallback()
	// Forget the context before calling into the plugin, so that a panic
	// cannot leak it.
	if s := dropHTTPStream(id); s != nil {
		s.ctx.OnHttpStreamDone()
		recycleHTTPStream(s) // not reached if the callback panics: s is left to the GC
		return
	}
	if root, ok := roots[id]; ok {
		delete(roots, id)
		if lastRootID == id {
			lastRootID, lastRoot = 0, nil
		}
		root.plugin.OnPluginDone()
		return
	}
	if s, ok := tcpStreams[id]; ok {
		delete(tcpStreams, id)
		s.ctx.OnStreamDone()
	}
}
