package host

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// StreamInfo is the downstream connection a stream arrives on.
type StreamInfo struct {
	// SourceAddress is the downstream remote address "ip:port"
	// (source.address): in Envoy, the trusted client address the HTTP
	// connection manager computed (use_remote_address,
	// xff_num_trusted_hops), port 0 when it came from X-Forwarded-For.
	// "" means "127.0.0.1:50000".
	SourceAddress string
	// DestinationAddress is the local address "ip:port"
	// (destination.address); "" means "127.0.0.1:10000".
	DestinationAddress string
	// ConnectionID is connection.id and connection_id; 0 means a fresh id
	// from a per-Host counter.
	ConnectionID uint64
	// Protocol is request.protocol; "" means "HTTP/1.1".
	Protocol string
}

// LocalReply is a response the filter sent with proxy_send_local_response.
type LocalReply struct {
	// Status is the HTTP status code.
	Status int
	// Headers are the filter's headers, lower-cased and appended in order
	// (Envoy addCopy).
	Headers Headers
	// Body is the reply body.
	Body []byte
	// Details is %RESPONSE_CODE_DETAILS%: the details argument with runs
	// of whitespace replaced by "_" (StringUtil::replaceAllEmptySpace).
	Details string
	// GRPCStatus is set when the guest passed 0..16; other values mean
	// none.
	GRPCStatus *int32
}

// Worker is one worker VM of a Host (an Envoy worker thread).
type Worker struct{ v *vm }

// Index returns the worker's index.
func (w *Worker) Index() int { return w.v.index }

// RootContextID returns the root context id, which Envoy allocates first
// in each VM (1).
func (w *Worker) RootContextID() uint32 { return w.v.rootID }

// Trace returns the calls recorded since the last ResetTrace when
// Config.Trace is set: callbacks as "proxy_on_request_headers(2, 3, 1)",
// hostcalls as "proxy_get_header_map_value -> OK", allocations as
// "proxy_on_memory_allocate(12)", WASI calls as "fd_write -> errno 0".
func (w *Worker) Trace() []string {
	var out []string
	_ = w.v.run(context.Background(), func() error {
		out = append([]string(nil), w.v.trace...)
		return nil
	})
	return out
}

// ResetTrace forgets the recorded trace.
func (w *Worker) ResetTrace() {
	_ = w.v.run(context.Background(), func() error { w.v.trace = nil; return nil })
}

// Failed returns the error that failed the VM, or nil.
func (w *Worker) Failed() error {
	var err error
	_ = w.v.run(context.Background(), func() error { err = w.v.failed; return nil })
	return err
}

// Stream is one HTTP stream through a worker's filter instance, driven
// phase by phase as Envoy's filter manager drives it: request headers,
// body, trailers, response headers, body, trailers, then Finish. Each
// phase returns the Status the filter left the stream in; when it is
// Paused, call Wait before the next phase.
type Stream struct {
	v  *vm
	st *stream
}

type stream struct {
	v       *vm
	id      uint32
	info    StreamInfo
	start   time.Time
	created bool

	reqHeaders, reqTrailers, respHeaders, respTrailers             Headers
	hasReqHeaders, hasReqTrailers, hasRespHeaders, hasRespTrailers bool
	reqBody, respBody, reqForwarded, respForwarded                 []byte
	hasReqBody, hasRespBody                                        bool

	status      Status
	pausedResp  bool // Paused on the response side
	pausedBody  bool // Paused in a body callback (StopIterationAndBuffer)
	localReply  *LocalReply
	resetReason string
	codeDetails string
	respStarted bool
	finished    bool
	changed     chan struct{}

	filterState map[string][]byte
	logs        []LogEntry
	traceStart  int
}

var connIDs atomic.Uint64

// NewStream creates a stream on the worker. Like Envoy, the context id is
// allocated now but proxy_on_context_create is sent lazily, before the
// first headers (ENVOY-CTX decodeHeaders → onCreate).
func (w *Worker) NewStream(info StreamInfo) (*Stream, error) {
	s := &Stream{v: w.v}
	err := w.v.run(context.Background(), func() error { return s.create(info) })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// create allocates the stream's context id and registers it; on the loop.
func (s *Stream) create(info StreamInfo) error {
	if info.SourceAddress == "" {
		info.SourceAddress = "127.0.0.1:50000"
	}
	if info.DestinationAddress == "" {
		info.DestinationAddress = "127.0.0.1:10000"
	}
	if info.ConnectionID == 0 {
		info.ConnectionID = connIDs.Add(1)
	}
	if info.Protocol == "" {
		info.Protocol = "HTTP/1.1"
	}
	v := s.v
	if v.failed != nil {
		return v.failed
	}
	st := &stream{v: v, id: v.allocContextID(), info: info, start: v.h.clock.Now(),
		changed: make(chan struct{}), filterState: map[string][]byte{}, traceStart: len(v.trace)}
	v.streams[st.id] = st
	s.st = st
	return nil
}

// ID returns the stream's context id.
func (s *Stream) ID() uint32 { return s.st.id }

func (st *stream) signal() {
	close(st.changed)
	st.changed = make(chan struct{})
}

func (st *stream) ensureCreated() error {
	if st.created {
		return nil
	}
	st.created = true
	_, err := st.v.callback("proxy_on_context_create", uint64(st.id), uint64(st.v.rootID))
	return err
}

// resume is the deferred effect of proxy_continue_stream.
func (st *stream) resume(response bool) {
	if st.status != Paused || st.pausedResp != response {
		return
	}
	st.flushBody()
	st.status = Continue
	st.signal()
}

func (st *stream) flushBody() {
	if !st.pausedBody {
		return
	}
	st.pausedBody = false
	if st.pausedResp {
		st.respForwarded = append(st.respForwarded, st.respBody...)
		st.respBody = nil
	} else {
		st.reqForwarded = append(st.reqForwarded, st.reqBody...)
		st.reqBody = nil
	}
}

func (st *stream) reset(reason string) {
	if st.status == Replied || st.status == Reset || st.finished {
		return
	}
	st.status, st.resetReason, st.codeDetails = Reset, reason, reason
	st.signal()
}

// sendLocalReply is the deferred effect of proxy_send_local_response.
func (st *stream) sendLocalReply(lr *LocalReply) {
	if st.finished || st.status == Replied || st.status == Reset {
		return
	}
	if st.respStarted {
		// Too late: response headers went downstream; Envoy resets.
		st.reset("wasm_local_reply_after_response_started")
		return
	}
	// Envoy prepareLocalReply (source/common/http/utility.cc): with a
	// body, content-length is set and content-type defaults to
	// text/plain.
	if len(lr.Body) > 0 {
		lr.Headers = lr.Headers.remove("content-length").add("content-length", strconv.Itoa(len(lr.Body)))
		if _, ok := lr.Headers.Lookup("content-type"); !ok {
			lr.Headers = lr.Headers.add("content-type", "text/plain")
		}
	}
	st.localReply = lr
	st.codeDetails = lr.Details
	st.status = Replied
	st.signal()
}

// phase runs one stream callback on the loop and maps its action:
// CONTINUE → Continue; PAUSE, or any return after a local reply
// (stopNextIteration), → Paused; effects deferred by the guest (local
// reply, continue, close) apply after the call.
func (s *Stream) phase(ctx context.Context, response, body bool, prepare func(st *stream) (string, []uint64)) (Status, error) {
	// The status comes back through a channel: when ctx ends first, run returns
	// while the callback may still be running on the loop, and the status it
	// then writes must not be read here.
	res := make(chan Status, 1)
	err := s.v.run(ctx, func() error {
		out, err := s.runPhase(response, body, prepare)
		res <- out
		return err
	})
	var out Status
	select {
	case out = <-res:
	default:
	}
	return out, err
}

// runPhase is phase's work on the loop.
func (s *Stream) runPhase(response, body bool, prepare func(st *stream) (string, []uint64)) (Status, error) {
	st := s.st
	if st.finished {
		return 0, ErrStreamState
	}
	if st.status == Replied || st.status == Reset {
		return st.status, nil
	}
	if st.status == Paused && !(body && st.pausedBody && st.pausedResp == response) {
		return 0, ErrStreamState
	}
	if err := st.ensureCreated(); err != nil {
		return 0, err
	}
	name, args := prepare(st)
	_, err := s.v.call(name, func(r uint64) {
		if uint32(r) == 1 || s.v.forceStop {
			st.status, st.pausedResp, st.pausedBody = Paused, response, body
		} else {
			st.status = Continue
			if body {
				st.pausedResp = response
				st.pausedBody = true
				st.flushBody()
			}
		}
	}, args...)
	return st.status, err
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// RequestHeaders delivers the request headers (keys are lower-cased and
// pseudo-headers moved first) through proxy_on_request_headers, creating
// the context first. endOfStream is true for a request without body or
// trailers.
func (s *Stream) RequestHeaders(ctx context.Context, h Headers, endOfStream bool) (Status, error) {
	return s.phase(ctx, false, false, func(st *stream) (string, []uint64) {
		st.reqHeaders, st.hasReqHeaders = h.normalize(), true
		return "proxy_on_request_headers", []uint64{uint64(st.id), uint64(len(st.reqHeaders)), boolArg(endOfStream)}
	})
}

// RequestBody delivers a body chunk through proxy_on_request_body with
// the size of everything buffered (after a PAUSE from a body callback
// Envoy buffers, StopIterationAndBuffer, and the next call sees the
// cumulative size). Calling it while the request is paused at its
// headers is ErrStreamState (Envoy would buffer without calling the
// filter).
func (s *Stream) RequestBody(ctx context.Context, chunk []byte, endOfStream bool) (Status, error) {
	return s.phase(ctx, false, true, func(st *stream) (string, []uint64) {
		st.reqBody, st.hasReqBody = append(st.reqBody, chunk...), true
		return "proxy_on_request_body", []uint64{uint64(st.id), uint64(len(st.reqBody)), boolArg(endOfStream)}
	})
}

// RequestTrailers delivers trailers through proxy_on_request_trailers.
func (s *Stream) RequestTrailers(ctx context.Context, t Headers) (Status, error) {
	return s.phase(ctx, false, false, func(st *stream) (string, []uint64) {
		st.reqTrailers, st.hasReqTrailers = t.normalize(), true
		return "proxy_on_request_trailers", []uint64{uint64(st.id), uint64(len(st.reqTrailers))}
	})
}

// ResponseHeaders delivers the upstream response headers (including
// ":status") through proxy_on_response_headers.
func (s *Stream) ResponseHeaders(ctx context.Context, h Headers, endOfStream bool) (Status, error) {
	return s.phase(ctx, true, false, func(st *stream) (string, []uint64) {
		st.respHeaders, st.hasRespHeaders = h.normalize(), true
		return "proxy_on_response_headers", []uint64{uint64(st.id), uint64(len(st.respHeaders)), boolArg(endOfStream)}
	})
}

// ResponseBody delivers a response body chunk through
// proxy_on_response_body, like RequestBody.
func (s *Stream) ResponseBody(ctx context.Context, chunk []byte, endOfStream bool) (Status, error) {
	return s.phase(ctx, true, true, func(st *stream) (string, []uint64) {
		st.respStarted = true
		st.respBody, st.hasRespBody = append(st.respBody, chunk...), true
		return "proxy_on_response_body", []uint64{uint64(st.id), uint64(len(st.respBody)), boolArg(endOfStream)}
	})
}

// ResponseTrailers delivers trailers through proxy_on_response_trailers.
func (s *Stream) ResponseTrailers(ctx context.Context, t Headers) (Status, error) {
	return s.phase(ctx, true, false, func(st *stream) (string, []uint64) {
		st.respStarted = true
		st.respTrailers, st.hasRespTrailers = t.normalize(), true
		return "proxy_on_response_trailers", []uint64{uint64(st.id), uint64(len(st.respTrailers))}
	})
}

// Wait blocks until the stream is no longer Paused (the guest called
// proxy_continue_stream, sent a local reply or closed the stream, for
// example from an HTTP callout's response) or ctx is done.
func (s *Stream) Wait(ctx context.Context) (Status, error) {
	for {
		var stat Status
		var ch chan struct{}
		var failed error
		err := s.v.run(ctx, func() error {
			stat, ch, failed = s.st.status, s.st.changed, s.v.failed
			return nil
		})
		if err != nil {
			// ctx ended or the VM closed before the read ran: stat may still be
			// written by it, so it is not read.
			return Paused, err
		}
		if stat != Paused {
			return stat, nil
		}
		if failed != nil {
			return stat, failed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Paused, ctx.Err()
		}
	}
}

// Finish ends the stream as Envoy does: proxy_on_log (from the access-log
// handler), then proxy_on_done and proxy_on_delete (from onDestroy) —
// docs/ENVOY.md, Lifecycle; the spec's order differs. A stream that never
// reached the filter gets proxy_on_context_create first (ENVOY-CTX
// Context::log → onCreate).
func (s *Stream) Finish(ctx context.Context) error {
	return s.v.run(ctx, s.finishOnLoop)
}

// finishOnLoop is Finish's work on the loop.
func (s *Stream) finishOnLoop() error {
	st := s.st
	if st.finished {
		return nil
	}
	if err := st.ensureCreated(); err != nil {
		return err
	}
	_, err := s.v.callback("proxy_on_log", uint64(st.id))
	if err == nil {
		_, err = s.v.callback("proxy_on_done", uint64(st.id)) // result ignored for streams
	}
	if err == nil {
		_, err = s.v.callback("proxy_on_delete", uint64(st.id))
	}
	st.finished = true
	delete(s.v.streams, st.id)
	st.signal()
	return err
}

// snapshot reads stream results on the loop.
func (s *Stream) snapshot(f func(st *stream)) {
	_ = s.v.run(context.Background(), func() error { f(s.st); return nil })
}

// RequestHeaderMap returns the request headers as the filter left them.
func (s *Stream) RequestHeaderMap() Headers {
	var h Headers
	s.snapshot(func(st *stream) { h = st.reqHeaders.Clone() })
	return h
}

// ResponseHeaderMap returns the response headers as the filter left them.
func (s *Stream) ResponseHeaderMap() Headers {
	var h Headers
	s.snapshot(func(st *stream) { h = st.respHeaders.Clone() })
	return h
}

// ForwardedRequestBody returns the request body the filter let through
// so far (after any proxy_set_buffer_bytes edits).
func (s *Stream) ForwardedRequestBody() []byte {
	var b []byte
	s.snapshot(func(st *stream) { b = append([]byte(nil), st.reqForwarded...) })
	return b
}

// ForwardedResponseBody returns the response body the filter let through
// so far.
func (s *Stream) ForwardedResponseBody() []byte {
	var b []byte
	s.snapshot(func(st *stream) { b = append([]byte(nil), st.respForwarded...) })
	return b
}

// LocalReply returns the filter's local reply, or nil.
func (s *Stream) LocalReply() *LocalReply {
	var lr *LocalReply
	s.snapshot(func(st *stream) { lr = st.localReply })
	return lr
}

// FilterState returns the stream's filter state as an access log reads it
// with %FILTER_STATE(key:PLAIN)%: the raw bytes of every
// proxy_set_property, keyed "wasm." + path.
func (s *Stream) FilterState() map[string]string {
	out := map[string]string{}
	s.snapshot(func(st *stream) {
		for k, v := range st.filterState {
			out[k] = string(v)
		}
	})
	return out
}

// Logs returns the log entries emitted while this stream was the
// effective context.
func (s *Stream) Logs() []LogEntry {
	var out []LogEntry
	s.snapshot(func(st *stream) { out = append(out, st.logs...) })
	return out
}

// Request is the input of Worker.Do.
type Request struct {
	// Method, Path, Authority and Scheme become :method, :path,
	// :authority and :scheme; "" means GET, "/", "localhost" and "http".
	Method, Path, Authority, Scheme string
	// Headers are the other request headers.
	Headers Headers
	// Body is the request body (sent as one chunk).
	Body []byte
	// Trailers, if non-nil, are sent after the body.
	Trailers Headers
	// Info describes the downstream connection.
	Info StreamInfo
	// Upstream answers the request if the filter lets it through; nil
	// means 200 with no body. It runs on the caller's goroutine.
	Upstream func(UpstreamRequest) UpstreamResponse
}

// UpstreamRequest is what reached the upstream: headers (with pseudo
// headers), body and trailers as the filter left them.
type UpstreamRequest struct {
	Headers  Headers
	Body     []byte
	Trailers Headers
}

// UpstreamResponse is an upstream's answer.
type UpstreamResponse struct {
	// Status is the HTTP status; 0 means 200.
	Status   int
	Headers  Headers
	Body     []byte
	Trailers Headers
}

// Response is what the client got from Worker.Do.
type Response struct {
	// Status is the response code.
	Status int
	// Headers are the response headers without ":status", as modified by
	// the filter (or the local reply's headers).
	Headers Headers
	// Body and Trailers as the filter let them through.
	Body     []byte
	Trailers Headers
	// LocalReply is non-nil when the filter answered itself.
	LocalReply *LocalReply
	// Upstream is what the upstream received, or nil if the request
	// never got there.
	Upstream *UpstreamRequest
	// Reset is set when the filter closed the stream (proxy_close_stream);
	// Status is then 0.
	Reset bool
	// FilterState is Stream.FilterState at the end of the stream.
	FilterState map[string]string
	// Logs are the log entries of the stream.
	Logs []LogEntry
	// Trace is the worker's trace from the stream's creation to its end
	// (Config.Trace); other activity on the worker in between shows too.
	Trace []string
}

func newRequestID() string {
	var b [16]byte
	randRead(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	var out strings.Builder
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out.WriteByte('-')
		}
		out.WriteByte(hex[c>>4])
		out.WriteByte(hex[c&15])
	}
	return out.String()
}

// requestHeaders builds the header map Envoy's HTTP/1 codec and HCM hand
// to the filter chain: :authority, :path, :method, :scheme, the client's
// headers, and (if absent) x-forwarded-proto and a generated
// x-request-id (HCM generate_request_id, on by default).
func (r Request) requestHeaders() Headers {
	def := func(s, d string) string {
		if s == "" {
			return d
		}
		return s
	}
	h := Headers{
		{":authority", def(r.Authority, "localhost")},
		{":path", def(r.Path, "/")},
		{":method", def(r.Method, "GET")},
		{":scheme", def(r.Scheme, "http")},
	}
	h = append(h, r.Headers.normalize()...)
	if _, ok := h.Lookup("x-forwarded-proto"); !ok {
		h = append(h, [2]string{"x-forwarded-proto", def(r.Scheme, "http")})
	}
	if _, ok := h.Lookup("x-request-id"); !ok {
		h = append(h, [2]string{"x-request-id", newRequestID()})
	}
	return h
}

// Do runs one request through the worker's filter: request headers (and
// body and trailers), waiting whenever the filter pauses; then, unless
// the filter replied or reset, req.Upstream and the response phases;
// then Finish. It returns what the client would get. A guest trap is
// returned as a *TrapError.
func (w *Worker) Do(ctx context.Context, req Request) (Response, error) {
	if len(req.Body) == 0 && req.Trailers == nil && req.Upstream == nil {
		s := &Stream{v: w.v}
		resp, done, err := s.doOnLoop(req)
		switch {
		case done && err != nil:
			return Response{}, err
		case done:
			return resp, nil
		case err != nil && s.st == nil:
			return Response{}, err
		case err == nil:
			// The filter paused the stream: wait for it, then go on phase by phase.
			resp, err = s.resume(ctx, req)
		}
		return s.finishDo(ctx, resp, err)
	}
	s, err := w.NewStream(req.Info)
	if err != nil {
		return Response{}, err
	}
	resp, err := s.do(ctx, req)
	return s.finishDo(ctx, resp, err)
}

// finishDo ends a stream Do drove phase by phase: Finish, then the stream's
// filter state, logs and trace into resp.
func (s *Stream) finishDo(ctx context.Context, resp Response, err error) (Response, error) {
	if ferr := s.Finish(ctx); err == nil {
		err = ferr
	}
	if err != nil {
		return Response{}, err
	}
	s.snapshot(func(st *stream) { s.capture(st, &resp) })
	return resp, nil
}

// capture copies the stream's filter state, logs and trace into resp; on
// the loop.
func (s *Stream) capture(st *stream, resp *Response) {
	resp.FilterState = make(map[string]string, len(st.filterState))
	for k, v := range st.filterState {
		resp.FilterState[k] = string(v)
	}
	resp.Logs = append([]LogEntry(nil), st.logs...)
	if st.traceStart <= len(s.v.trace) {
		resp.Trace = append([]string(nil), s.v.trace[st.traceStart:]...)
	}
}

// doOnLoop creates a stream and runs a request without body, trailers or
// Upstream (so answered 200 with no body) in one visit to the VM's loop: the
// same callbacks in the same order as NewStream, do and Finish, without a
// hop per phase. done is false when the filter paused the stream (its
// request or response headers), or when an error came before the stream
// was finished; the caller then goes on with resume, or finishes it.
func (s *Stream) doOnLoop(req Request) (resp Response, done bool, err error) {
	// Nothing in it waits, so the wait for it is not bounded by the caller's
	// context (which would leave s.st unsafe to read).
	err = s.v.run(context.Background(), func() error {
		var err error
		resp, done, err = s.doHere(req)
		return err
	})
	if err != nil {
		return Response{}, done, err
	}
	return resp, done, nil
}

// doHere is doOnLoop's work, on the loop.
func (s *Stream) doHere(req Request) (resp Response, done bool, err error) {
	if err := s.create(req.Info); err != nil {
		return Response{}, false, err
	}
	stat, err := s.runPhase(false, false, func(st *stream) (string, []uint64) {
		st.reqHeaders, st.hasReqHeaders = req.requestHeaders().normalize(), true
		return "proxy_on_request_headers", []uint64{uint64(st.id), uint64(len(st.reqHeaders)), 1}
	})
	if err != nil || stat == Paused {
		return Response{}, false, err
	}
	var up *UpstreamRequest
	if stat == Continue {
		up = &UpstreamRequest{Headers: s.st.reqHeaders.Clone(), Trailers: s.st.reqTrailers.Clone()}
		stat, err = s.runPhase(true, false, func(st *stream) (string, []uint64) {
			st.respHeaders, st.hasRespHeaders = Headers{{":status", "200"}}, true
			return "proxy_on_response_headers", []uint64{uint64(st.id), uint64(len(st.respHeaders)), 1}
		})
		if err != nil || stat == Paused {
			return Response{}, false, err
		}
	}
	resp = s.resultOnLoop(s.st, up)
	err = s.finishOnLoop()
	s.capture(s.st, &resp)
	return resp, true, err
}

// DoBatch sends reqs through the worker in order, as Do sends each, but
// runs as many of them as it can in one visit to the VM's loop: before(i),
// if not nil, runs on the loop just before request i starts (to move a
// VirtualClock on which no timer falls due by then: Advance fires nothing
// else there). A request with a body, trailers or an Upstream func, and one
// the filter pauses, is finished as Do finishes it, after its visit, and the
// rest go on in a new visit. It returns every response, or the first error
// (the requests after it are not sent).
func (w *Worker) DoBatch(ctx context.Context, reqs []Request, before func(i int)) ([]Response, error) {
	out := make([]Response, len(reqs))
	for n := 0; n < len(reqs); {
		var paused *Stream
		var failed error
		err := w.v.run(context.Background(), func() error {
			for ; n < len(reqs); n++ {
				r := reqs[n]
				if len(r.Body) > 0 || r.Trailers != nil || r.Upstream != nil {
					return nil
				}
				if before != nil {
					before(n)
				}
				s := &Stream{v: w.v}
				resp, done, err := s.doHere(r)
				if !done && (err == nil || s.st != nil) {
					paused, failed = s, err
					return nil
				}
				if err != nil {
					return err
				}
				out[n] = resp
			}
			return nil
		})
		switch {
		case err != nil:
			return nil, err
		case n == len(reqs):
		case paused != nil:
			var resp Response
			if failed == nil {
				resp, failed = paused.resume(ctx, reqs[n])
			}
			if out[n], err = paused.finishDo(ctx, resp, failed); err != nil {
				return nil, err
			}
			n++
		default:
			if before != nil {
				i := n
				_ = w.v.run(context.Background(), func() error { before(i); return nil })
			}
			if out[n], err = w.Do(ctx, reqs[n]); err != nil {
				return nil, err
			}
			n++
		}
	}
	return out, nil
}

// resume goes on with a stream doOnLoop left paused: it waits, then runs
// what is left of do.
func (s *Stream) resume(ctx context.Context, req Request) (Response, error) {
	stat, err := s.Wait(ctx)
	if err != nil {
		return Response{}, err
	}
	var respPhase bool
	s.snapshot(func(st *stream) { respPhase = st.hasRespHeaders })
	if respPhase {
		var up UpstreamRequest
		s.snapshot(func(st *stream) {
			up = UpstreamRequest{Headers: st.reqHeaders.Clone(), Trailers: st.reqTrailers.Clone()}
		})
		return s.result(&up), nil
	}
	return s.afterRequest(ctx, req, stat)
}

func (s *Stream) do(ctx context.Context, req Request) (Response, error) {
	// step waits out a pause.
	step := func(stat Status, err error) (Status, error) {
		if err != nil || stat != Paused {
			return stat, err
		}
		return s.Wait(ctx)
	}
	hasBody, hasTrailers := len(req.Body) > 0, req.Trailers != nil
	stat, err := step(s.RequestHeaders(ctx, req.requestHeaders(), !hasBody && !hasTrailers))
	if err == nil && stat == Continue && hasBody {
		stat, err = step(s.RequestBody(ctx, req.Body, !hasTrailers))
	}
	if err == nil && stat == Continue && hasTrailers {
		stat, err = step(s.RequestTrailers(ctx, req.Trailers))
	}
	if err != nil {
		return Response{}, err
	}
	return s.afterRequest(ctx, req, stat)
}

// afterRequest is do after the request phases ended with stat: the
// upstream and the response phases when the filter let the request through.
func (s *Stream) afterRequest(ctx context.Context, req Request, stat Status) (Response, error) {
	step := func(stat Status, err error) (Status, error) {
		if err != nil || stat != Paused {
			return stat, err
		}
		return s.Wait(ctx)
	}
	hasBody := len(req.Body) > 0
	if stat != Continue {
		return s.result(nil), nil
	}
	var up UpstreamRequest
	s.snapshot(func(st *stream) {
		up = UpstreamRequest{Headers: st.reqHeaders.Clone(), Body: append([]byte(nil), st.reqForwarded...), Trailers: st.reqTrailers.Clone()}
		if !hasBody {
			up.Body = nil
		}
	})
	ur := UpstreamResponse{Status: 200}
	if req.Upstream != nil {
		ur = req.Upstream(up)
		if ur.Status == 0 {
			ur.Status = 200
		}
	}
	rh := append(Headers{{":status", strconv.Itoa(ur.Status)}}, ur.Headers.normalize()...)
	hasBody, hasTrailers := len(ur.Body) > 0, ur.Trailers != nil
	var err error
	stat, err = step(s.ResponseHeaders(ctx, rh, !hasBody && !hasTrailers))
	if err == nil && stat == Continue && hasBody {
		stat, err = step(s.ResponseBody(ctx, ur.Body, !hasTrailers))
	}
	if err == nil && stat == Continue && hasTrailers {
		_, err = step(s.ResponseTrailers(ctx, ur.Trailers))
	}
	if err != nil {
		return Response{}, err
	}
	return s.result(&up), nil
}

func (s *Stream) result(up *UpstreamRequest) Response {
	var r Response
	s.snapshot(func(st *stream) { r = s.resultOnLoop(st, up) })
	return r
}

// resultOnLoop is the Response of the stream as it stands; on the loop.
func (s *Stream) resultOnLoop(st *stream, up *UpstreamRequest) Response {
	var r Response
	switch {
	case st.localReply != nil:
		lr := st.localReply
		r = Response{Status: lr.Status, Headers: lr.Headers.Clone(), Body: append([]byte(nil), lr.Body...), LocalReply: lr}
	case st.status == Reset:
		r = Response{Reset: true}
	default:
		r.Status, _ = strconv.Atoi(st.respHeaders.Get(":status"))
		for _, kv := range st.respHeaders {
			if !strings.HasPrefix(kv[0], ":") {
				r.Headers = append(r.Headers, kv)
			}
		}
		r.Body = append([]byte(nil), st.respForwarded...)
		if len(r.Body) == 0 {
			r.Body = nil
		}
		r.Trailers = st.respTrailers.Clone()
	}
	r.Upstream = up
	return r
}
