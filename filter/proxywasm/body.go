package proxywasm

import "math"

// Bodies (spec v0.2.1 "Buffers", proxy_get_buffer_bytes and
// proxy_set_buffer_bytes). Offsets and sizes are in bytes. A body is
// readable in the body callbacks (while paused, the host reports the total
// buffered size) and, in Envoy, replaceable there. Errors: ErrNotFound
// when the buffer does not exist in the current callback, ErrBadArgument
// for a negative start or maxSize.

// GetHttpRequestBody returns up to maxSize bytes of the request body from
// offset start (buffer 0, HTTP_REQUEST_BODY).
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return getBuffer(BufferTypeHttpRequestBody, start, maxSize)
}

// GetHttpResponseBody returns up to maxSize bytes of the response body from
// offset start (buffer 1, HTTP_RESPONSE_BODY).
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(BufferTypeHttpResponseBody, start, maxSize)
}

// GetHttpCallResponseBody returns up to maxSize bytes of an HTTP call's
// response body from offset start (buffer 4, HTTP_CALL_RESPONSE_BODY).
// Readable only inside the DispatchHttpCall callback, whose bodySize gives
// the length.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(BufferTypeHttpCallResponseBody, start, maxSize)
}

// GetDownstreamData returns up to maxSize bytes of the downstream data
// buffer from offset start (buffer 2, DOWNSTREAM_DATA), in
// TcpContext.OnDownstreamData.
func GetDownstreamData(start, maxSize int) ([]byte, error) {
	return getBuffer(BufferTypeDownstreamData, start, maxSize)
}

// GetUpstreamData returns up to maxSize bytes of the upstream data buffer
// from offset start (buffer 3, UPSTREAM_DATA), in TcpContext.OnUpstreamData.
func GetUpstreamData(start, maxSize int) ([]byte, error) {
	return getBuffer(BufferTypeUpstreamData, start, maxSize)
}

// SetHttpRequestBody replaces the whole buffered request body with body:
// proxy_set_buffer_bytes(0, start=0, size=MaxInt32), which Envoy executes
// as drain everything, then prepend.
func SetHttpRequestBody(body []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpRequestBody, 0, math.MaxInt32, body))
}

// AppendHttpRequestBody appends data to the buffered request body:
// proxy_set_buffer_bytes(0, start=MaxInt32, size=0).
func AppendHttpRequestBody(data []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpRequestBody, math.MaxInt32, 0, data))
}

// PrependHttpRequestBody inserts data before the buffered request body:
// proxy_set_buffer_bytes(0, start=0, size=0).
func PrependHttpRequestBody(data []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpRequestBody, 0, 0, data))
}

// SetHttpResponseBody replaces the whole buffered response body with body
// (buffer 1; see SetHttpRequestBody).
func SetHttpResponseBody(body []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpResponseBody, 0, math.MaxInt32, body))
}

// AppendHttpResponseBody appends data to the buffered response body
// (buffer 1; see AppendHttpRequestBody).
func AppendHttpResponseBody(data []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpResponseBody, math.MaxInt32, 0, data))
}

// PrependHttpResponseBody inserts data before the buffered response body
// (buffer 1; see PrependHttpRequestBody).
func PrependHttpResponseBody(data []byte) error {
	return statusError(hostSetBufferBytes(BufferTypeHttpResponseBody, 0, 0, data))
}
