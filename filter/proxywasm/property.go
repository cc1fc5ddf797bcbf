package proxywasm

import "unsafe"

// appendPropertyPath serializes a property path as its segments joined by
// NUL bytes, with no trailing NUL (envoy context.cc Context::getProperty
// splits on '\0').
func appendPropertyPath(dst []byte, path []string) []byte {
	for i, seg := range path {
		if i > 0 {
			dst = append(dst, 0)
		}
		dst = append(dst, seg...)
	}
	return dst
}

// GetProperty reads a host property with proxy_get_property (spec v0.2.1
// "Properties"), e.g. []string{"request", "path"} or []string{"plugin_name"}.
// The value encoding depends on the attribute (Envoy's attributes doc;
// docs/ENVOY.md, Properties and filter state): strings and bytes raw,
// integers 8 bytes little-endian, maps as pairs. Envoy resolves attributes
// first, then plugin tokens, then filter state "wasm.<name>".
//
// Errors: ErrNotFound if the property does not exist;
// ErrSerializationFailure if Envoy cannot serialize it.
func GetProperty(path []string) ([]byte, error) {
	p := appendPropertyPath(scratch[:0], path)
	b, st := hostGetProperty(p)
	releaseScratch(p)
	if err := statusError(st); err != nil {
		return nil, err
	}
	return b, nil
}

// SetProperty writes value with proxy_set_property (spec v0.2.1
// "Properties"). Envoy stores it as filter state "wasm.<path>" (Bytes, life
// span FilterChain), readable in access logs as
// %FILTER_STATE(wasm.<path>:PLAIN)% (envoy context.cc Context::setProperty;
// docs/ENVOY.md, Properties and filter state). Use a single path segment: the
// separators become part of the key.
//
// Errors: ErrNotFound on a root context (no stream info); ErrBadArgument
// for a second write to a read-only declared property.
func SetProperty(path []string, value []byte) error {
	if len(path) == 1 {
		// One segment is its own serialization: the host reads it where it
		// is (a request's filter-state write builds nothing).
		return statusError(hostSetProperty(stringView(path[0]), value))
	}
	p := appendPropertyPath(scratch[:0], path)
	st := hostSetProperty(p, value)
	releaseScratch(p)
	return statusError(st)
}

// stringView views s as bytes without copying, for a hostcall that only
// reads them. Nothing may write through it.
func stringView(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
