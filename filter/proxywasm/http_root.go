package proxywasm

// DispatchRootHttpCall is DispatchHttpCall for a call that belongs to the
// current root context even when dispatched from a stream callback: its
// callback runs on the root context, with no effective stream, and is not
// skipped when the stream that happened to dispatch it ends. The host side
// is the same either way (Envoy files every call under
// contextOrEffectiveContext()->root_context(); docs/ENVOY.md, HTTP calls);
// use it for a call many streams wait on, and set the effective context to
// each of them (SetEffectiveContext) before resuming or answering it.
func DispatchRootHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillis uint32, callback func(numHeaders, bodySize, numTrailers int)) (calloutID uint32, err error) {
	rootID, known := rootIDOf(activeContextID)
	if !known {
		return 0, ErrNotFound
	}
	saved := activeContextID
	activeContextID = rootID
	defer func() { activeContextID = saved }()
	return DispatchHttpCall(cluster, headers, body, trailers, timeoutMillis, callback)
}
