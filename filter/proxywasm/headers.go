package proxywasm

import "github.com/sluice-proxy/sluice/filter/proxywasm/pairs"

// Header maps (spec v0.2.1 "HTTP fields"). Pairs are (key, value) in the
// host's order; Envoy lower-cases keys on every write, returns only the
// first value of a repeated header from the single-value getters, and
// implements the Replace*s functions as "remove all, then add" (envoy
// context.cc; docs/ENVOY.md, Header maps). The returned strings are views
// of a buffer the host allocated for this call; they are never modified.
//
// Errors: ErrNotFound for a missing header (single-value getters) or a map
// that does not exist in the current callback; a *pairs.DecodeError if the
// host sent a malformed map.

// scratch is reused to serialize maps and property paths for one hostcall
// at a time (a VM runs one callback at a time). Buffers above
// maxScratchBytes are not kept.
var scratch []byte

const maxScratchBytes = 64 << 10

func releaseScratch(b []byte) {
	if cap(b) <= maxScratchBytes {
		scratch = b[:0]
	}
}

// getMap reads a whole map with proxy_get_header_map_pairs: one hostcall,
// then one allocation for the result slice; keys and values share the
// host's buffer.
func getMap(mt MapType) ([][2]string, error) {
	b, st := hostGetHeaderMapPairs(mt)
	if err := statusError(st); err != nil {
		return nil, err
	}
	return pairs.DecodeString(bytesString(b))
}

// getMapValue reads one value with a single proxy_get_header_map_value.
func getMapValue(mt MapType, key string) (string, error) {
	b, st := hostGetHeaderMapValue(mt, key)
	if err := statusError(st); err != nil {
		return "", err
	}
	return bytesString(b), nil
}

// setMap replaces a whole map with proxy_set_header_map_pairs.
func setMap(mt MapType, headers [][2]string) error {
	b := pairs.AppendEncode(scratch[:0], headers)
	st := hostSetHeaderMapPairs(mt, b)
	releaseScratch(b)
	return statusError(st)
}

func addMapValue(mt MapType, key, value string) error {
	return statusError(hostAddHeaderMapValue(mt, key, value))
}

func replaceMapValue(mt MapType, key, value string) error {
	return statusError(hostReplaceHeaderMapValue(mt, key, value))
}

func removeMapValue(mt MapType, key string) error {
	return statusError(hostRemoveHeaderMapValue(mt, key))
}

// GetHeaderMapSize returns the size of a header map with
// proxy_get_header_map_size. Envoy reports the serialized size in bytes,
// not the number of pairs (envoy context.cc getHeaderMapSize).
func GetHeaderMapSize(mt MapType) (sizeBytes uint32, err error) {
	size, st := hostGetHeaderMapSize(mt)
	if err := statusError(st); err != nil {
		return 0, err
	}
	return size, nil
}

// GetHttpRequestHeaders returns all request headers, pseudo-headers
// (":path", ":method", ":authority", ...) included, with
// proxy_get_header_map_pairs on map 0 (HTTP_REQUEST_HEADERS).
func GetHttpRequestHeaders() ([][2]string, error) { return getMap(MapTypeHttpRequestHeaders) }

// GetHttpRequestHeader returns the first value of request header key with
// one proxy_get_header_map_value on map 0. Errors: ErrNotFound if absent.
func GetHttpRequestHeader(key string) (string, error) {
	return getMapValue(MapTypeHttpRequestHeaders, key)
}

// AddHttpRequestHeader appends a request header with
// proxy_add_header_map_value on map 0, keeping existing values of key.
func AddHttpRequestHeader(key, value string) error {
	return addMapValue(MapTypeHttpRequestHeaders, key, value)
}

// ReplaceHttpRequestHeader sets request header key to value, replacing
// all its values, with proxy_replace_header_map_value on map 0.
func ReplaceHttpRequestHeader(key, value string) error {
	return replaceMapValue(MapTypeHttpRequestHeaders, key, value)
}

// RemoveHttpRequestHeader removes every value of request header key with
// proxy_remove_header_map_value on map 0.
func RemoveHttpRequestHeader(key string) error {
	return removeMapValue(MapTypeHttpRequestHeaders, key)
}

// ReplaceHttpRequestHeaders replaces all request headers with headers,
// with proxy_set_header_map_pairs on map 0.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	return setMap(MapTypeHttpRequestHeaders, headers)
}

// GetHttpResponseHeaders returns all response headers, ":status" included,
// with proxy_get_header_map_pairs on map 2 (HTTP_RESPONSE_HEADERS).
func GetHttpResponseHeaders() ([][2]string, error) { return getMap(MapTypeHttpResponseHeaders) }

// GetHttpResponseHeader returns the first value of response header key
// with one proxy_get_header_map_value on map 2. Errors: ErrNotFound if
// absent.
func GetHttpResponseHeader(key string) (string, error) {
	return getMapValue(MapTypeHttpResponseHeaders, key)
}

// AddHttpResponseHeader appends a response header with
// proxy_add_header_map_value on map 2.
func AddHttpResponseHeader(key, value string) error {
	return addMapValue(MapTypeHttpResponseHeaders, key, value)
}

// ReplaceHttpResponseHeader sets response header key to value with
// proxy_replace_header_map_value on map 2.
func ReplaceHttpResponseHeader(key, value string) error {
	return replaceMapValue(MapTypeHttpResponseHeaders, key, value)
}

// RemoveHttpResponseHeader removes response header key with
// proxy_remove_header_map_value on map 2.
func RemoveHttpResponseHeader(key string) error {
	return removeMapValue(MapTypeHttpResponseHeaders, key)
}

// ReplaceHttpResponseHeaders replaces all response headers with
// proxy_set_header_map_pairs on map 2.
func ReplaceHttpResponseHeaders(headers [][2]string) error {
	return setMap(MapTypeHttpResponseHeaders, headers)
}

// GetHttpRequestTrailers returns all request trailers with
// proxy_get_header_map_pairs on map 1 (HTTP_REQUEST_TRAILERS).
func GetHttpRequestTrailers() ([][2]string, error) { return getMap(MapTypeHttpRequestTrailers) }

// GetHttpRequestTrailer returns the first value of request trailer key
// with proxy_get_header_map_value on map 1. Errors: ErrNotFound if absent.
func GetHttpRequestTrailer(key string) (string, error) {
	return getMapValue(MapTypeHttpRequestTrailers, key)
}

// AddHttpRequestTrailer appends a request trailer with
// proxy_add_header_map_value on map 1.
func AddHttpRequestTrailer(key, value string) error {
	return addMapValue(MapTypeHttpRequestTrailers, key, value)
}

// ReplaceHttpRequestTrailer sets request trailer key with
// proxy_replace_header_map_value on map 1.
func ReplaceHttpRequestTrailer(key, value string) error {
	return replaceMapValue(MapTypeHttpRequestTrailers, key, value)
}

// RemoveHttpRequestTrailer removes request trailer key with
// proxy_remove_header_map_value on map 1.
func RemoveHttpRequestTrailer(key string) error {
	return removeMapValue(MapTypeHttpRequestTrailers, key)
}

// ReplaceHttpRequestTrailers replaces all request trailers with
// proxy_set_header_map_pairs on map 1.
func ReplaceHttpRequestTrailers(trailers [][2]string) error {
	return setMap(MapTypeHttpRequestTrailers, trailers)
}

// GetHttpResponseTrailers returns all response trailers with
// proxy_get_header_map_pairs on map 3 (HTTP_RESPONSE_TRAILERS).
func GetHttpResponseTrailers() ([][2]string, error) { return getMap(MapTypeHttpResponseTrailers) }

// GetHttpResponseTrailer returns the first value of response trailer key
// with proxy_get_header_map_value on map 3. Errors: ErrNotFound if absent.
func GetHttpResponseTrailer(key string) (string, error) {
	return getMapValue(MapTypeHttpResponseTrailers, key)
}

// AddHttpResponseTrailer appends a response trailer with
// proxy_add_header_map_value on map 3.
func AddHttpResponseTrailer(key, value string) error {
	return addMapValue(MapTypeHttpResponseTrailers, key, value)
}

// ReplaceHttpResponseTrailer sets response trailer key with
// proxy_replace_header_map_value on map 3.
func ReplaceHttpResponseTrailer(key, value string) error {
	return replaceMapValue(MapTypeHttpResponseTrailers, key, value)
}

// RemoveHttpResponseTrailer removes response trailer key with
// proxy_remove_header_map_value on map 3.
func RemoveHttpResponseTrailer(key string) error {
	return removeMapValue(MapTypeHttpResponseTrailers, key)
}

// ReplaceHttpResponseTrailers replaces all response trailers with
// proxy_set_header_map_pairs on map 3.
func ReplaceHttpResponseTrailers(trailers [][2]string) error {
	return setMap(MapTypeHttpResponseTrailers, trailers)
}

// GetHttpCallResponseHeaders returns the headers (":status" included) of
// an HTTP call response with proxy_get_header_map_pairs on map 6
// (HTTP_CALL_RESPONSE_HEADERS). Readable only inside the DispatchHttpCall
// callback.
func GetHttpCallResponseHeaders() ([][2]string, error) {
	return getMap(MapTypeHttpCallResponseHeaders)
}

// GetHttpCallResponseHeader returns the first value of an HTTP call
// response header with proxy_get_header_map_value on map 6. Errors:
// ErrNotFound if absent.
func GetHttpCallResponseHeader(key string) (string, error) {
	return getMapValue(MapTypeHttpCallResponseHeaders, key)
}

// GetHttpCallResponseTrailers returns the trailers of an HTTP call
// response with proxy_get_header_map_pairs on map 7
// (HTTP_CALL_RESPONSE_TRAILERS). Readable only inside the DispatchHttpCall
// callback.
func GetHttpCallResponseTrailers() ([][2]string, error) {
	return getMap(MapTypeHttpCallResponseTrailers)
}
