package proxywasm

import (
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
)

// DispatchHttpCall sends an HTTP request to the Envoy cluster named cluster
// with proxy_http_call (spec v0.2.1 "HTTP calls"; docs/ENVOY.md, HTTP calls)
// and returns the call's token. headers must include ":method", ":path" and
// ":authority"; body and trailers may be empty. timeoutMillis is in
// milliseconds, 0 meaning no timeout.
//
// The call belongs to the current root context (also when dispatched from
// a stream) and outlives the stream. When the response arrives, callback
// runs in proxy_on_http_call_response with the number of response headers,
// the body size in bytes and the number of trailers; read them with
// GetHttpCallResponseHeaders, GetHttpCallResponseBody and
// GetHttpCallResponseTrailers. numHeaders == 0 means the call failed
// (GetStatus: 11 BrokenConnection, "reset" in Envoy); timeouts and
// upstream errors usually arrive as normal responses, so check ":status".
// If the call was dispatched from a stream, the callback runs with that
// stream as effective context (so ResumeHttpRequest and SendHttpResponse
// act on it), and it is skipped if the stream was deleted meanwhile.
//
// Errors: ErrBadArgument for an unknown cluster or missing pseudo-headers;
// ErrInternalFailure if Envoy fails the request inline (e.g. no healthy
// host). On error callback is never called.
func DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillis uint32, callback func(numHeaders, bodySize, numTrailers int)) (calloutID uint32, err error) {
	rootID, known := rootIDOf(activeContextID)
	root := roots[rootID]
	if !known || root == nil {
		return 0, ErrNotFound
	}
	buf := pairs.AppendEncode(scratch[:0], headers)
	nh := len(buf)
	buf = pairs.AppendEncode(buf, trailers)
	token, st := hostHttpCall(cluster, buf[:nh], body, buf[nh:], timeoutMillis)
	releaseScratch(buf)
	if err := statusError(st); err != nil {
		return 0, err
	}
	if root.callouts == nil {
		root.callouts = make(map[uint32]callout)
	}
	c := callout{callback: callback}
	if activeContextID != rootID {
		c.streamID = activeContextID
	}
	root.callouts[token] = c
	return token, nil
}

// onHttpCallResponse implements proxy_on_http_call_response(root_context_id,
// token, num_headers, body_size, num_trailers) (spec v0.2.1 "HTTP calls").
func onHttpCallResponse(rootID, token, numHeaders, bodySize, numTrailers uint32) {
	activeContextID = rootID
	callbackName = "proxy_on_http_call_response"
	defer endCallback()
	root, ok := roots[rootID]
	if !ok {
		return
	}
	c, ok := root.callouts[token]
	if !ok {
		LogDebug("proxywasm: response for unknown http call " + strconv.FormatUint(uint64(token), 10))
		return
	}
	delete(root.callouts, token)
	if c.streamID != 0 {
		if _, alive := rootIDOf(c.streamID); !alive {
			LogDebug("proxywasm: http call " + strconv.FormatUint(uint64(token), 10) + " answered after stream " + strconv.FormatUint(uint64(c.streamID), 10) + " ended; callback skipped")
			return
		}
		if err := SetEffectiveContext(c.streamID); err != nil {
			logAlways(LogLevelError, "proxywasm: proxy_set_effective_context("+strconv.FormatUint(uint64(c.streamID), 10)+"): "+err.Error())
			return
		}
	}
	if c.callback != nil {
		c.callback(int(numHeaders), int(bodySize), int(numTrailers))
	}
}

// GrpcStatusNone is the grpcStatus for SendHttpResponse that sends no
// grpc-status (Envoy uses one only in 0..16).
const GrpcStatusNone int32 = -1

// SendHttpResponse answers the current stream with a local reply instead of
// forwarding it, with proxy_send_local_response (spec v0.2.1 "HTTP streams";
// docs/ENVOY.md, Local replies). statusCode is the HTTP status, headers are
// appended (keys lower-cased), grpcStatus is a gRPC status 0..16 or
// GrpcStatusNone. Envoy sends the reply after the callback returns and forces
// that callback's result to stop; return types.ActionPause. It is allowed
// only before response headers went downstream. On a root context without an
// effective stream Envoy silently does nothing.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, grpcStatus int32) error {
	return SendHttpResponseWithDetails(statusCode, "", headers, body, grpcStatus)
}

// SendHttpResponseWithDetails is SendHttpResponse with response code
// details, which Envoy shows as %RESPONSE_CODE_DETAILS% (whitespace
// replaced).
func SendHttpResponseWithDetails(statusCode uint32, details string, headers [][2]string, body []byte, grpcStatus int32) error {
	buf := pairs.AppendEncode(scratch[:0], headers)
	st := hostSendLocalResponse(statusCode, details, body, buf, grpcStatus)
	releaseScratch(buf)
	return statusError(st)
}

// SendHttpResponseEncoded is SendHttpResponseWithDetails with the headers
// already in the proxy-wasm pairs encoding (pairs.AppendEncode: a count,
// then each key's and value's length, then the NUL-terminated texts), for a
// caller that sends the same headers again and keeps their encoding.
func SendHttpResponseEncoded(statusCode uint32, details string, encodedHeaders []byte, body []byte, grpcStatus int32) error {
	return statusError(hostSendLocalResponse(statusCode, details, body, encodedHeaders, grpcStatus))
}

// ResumeHttpRequest resumes a request paused with types.ActionPause, with
// proxy_continue_stream(HTTP_REQUEST) (spec v0.2.1 "HTTP streams"). Envoy
// resumes after the current callback returns.
func ResumeHttpRequest() error { return ContinueStream(StreamTypeHttpRequest) }

// ResumeHttpResponse resumes a paused response with
// proxy_continue_stream(HTTP_RESPONSE).
func ResumeHttpResponse() error { return ContinueStream(StreamTypeHttpResponse) }

// ContinueStream resumes the given stream with proxy_continue_stream.
// Errors: ErrUnimplemented for StreamTypeUpstream in Envoy.
func ContinueStream(st StreamType) error { return statusError(hostContinueStream(st)) }

// CloseStream resets the given stream with proxy_close_stream (spec v0.2.1
// "HTTP streams"); Envoy reports details "wasm_close_stream".
func CloseStream(st StreamType) error { return statusError(hostCloseStream(st)) }
