package host

import "strings"

// Stream control: proxy_continue_stream, proxy_close_stream and
// proxy_send_local_response (spec v0.2.1 "HTTP streams").

func hostContinueStream(v *vm, s []uint64) status {
	switch uint32(s[0]) {
	case 0, 1:
	case 2, 3:
		return statusUnimplemented // ENVOY-CTX continueStream: not for HTTP.
	default:
		return statusBadArgument
	}
	st := v.effectiveStream()
	if st == nil {
		return statusNotFound
	}
	response := uint32(s[0]) == 1
	// Deferred until the VM call returns (ENVOY-CTX continueStream posts
	// continueDecoding/continueEncoding as an after-VM-call action).
	v.afterCall = append(v.afterCall, func() { st.resume(response) })
	return statusOK
}

func hostCloseStream(v *vm, s []uint64) status {
	switch uint32(s[0]) {
	case 0, 1:
	case 2, 3:
		return statusUnimplemented
	default:
		return statusBadArgument
	}
	st := v.effectiveStream()
	if st == nil {
		return statusNotFound
	}
	// ENVOY-CTX closeStream: resetStream with details wasm_close_stream.
	v.afterCall = append(v.afterCall, func() { st.reset("wasm_close_stream") })
	return statusOK
}

func hostSendLocalResponse(v *vm, s []uint64) status {
	details, ok1 := v.readString(uint32(s[1]), uint32(s[2]))
	body, ok2 := v.read(uint32(s[3]), uint32(s[4]))
	hraw, ok3 := v.read(uint32(s[5]), uint32(s[6]))
	if !ok1 || !ok2 || !ok3 {
		return statusInvalidMemoryAccess
	}
	body = append([]byte(nil), body...)
	ps, ok := decodePairs(hraw)
	if !ok {
		ps = nil
	}
	st := v.effectiveStream()
	if st == nil {
		// ENVOY-CTX sendLocalResponse: no decoder callbacks on a root
		// context, so a silent no-op that still returns OK.
		return statusOK
	}
	lr := &LocalReply{Status: int(uint32(s[0])), Body: body, Details: strings.Join(strings.Fields(details), "_")}
	for _, kv := range ps {
		// addCopy appends, keys lower-cased.
		lr.Headers = lr.Headers.add(strings.ToLower(kv[0]), kv[1])
	}
	if g := int32(uint32(s[7])); g >= 0 && g <= 16 {
		lr.GRPCStatus = &g
	}
	// CPPHOST send_local_response: stopNextIteration(true); the reply
	// itself is sent after the VM call (ENVOY-CTX).
	v.forceStop = true
	v.afterCall = append(v.afterCall, func() { st.sendLocalReply(lr) })
	return statusOK
}
