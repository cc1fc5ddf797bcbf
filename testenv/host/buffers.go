package host

// Buffers: proxy_get_buffer_bytes, proxy_get_buffer_status and proxy_set_buffer_bytes
// (spec v0.2.1 "Buffers").

func (v *vm) buffer(t uint32) ([]byte, bool) {
	switch t {
	case bufRequestBody, bufResponseBody:
		st := v.effectiveStream()
		if st == nil {
			return nil, false
		}
		if t == bufRequestBody {
			return st.reqBody, st.hasReqBody
		}
		return st.respBody, st.hasRespBody
	case bufCallResponseBody:
		if v.callout == nil {
			return nil, false
		}
		return v.callout.body, true
	case bufVMConfig:
		return v.h.cfg.VMConfig, v.readVMConfig
	case bufPluginConfig:
		return v.h.cfg.PluginConfig, v.readPlugin
	}
	return nil, false
}

func hostGetBufferBytes(v *vm, s []uint64) status {
	data, ok := v.buffer(uint32(s[0]))
	if !ok {
		return statusNotFound
	}
	start, max := uint64(uint32(s[1])), uint64(uint32(s[2]))
	// CPPHOST exports.cc get_buffer_bytes: overflow is BAD_ARGUMENT; the
	// range is clamped to the buffer.
	if start > uint64(len(data)) {
		start = uint64(len(data))
	}
	end := start + max
	if end > uint64(len(data)) {
		end = uint64(len(data))
	}
	return v.copyOut(append([]byte(nil), data[start:end]...), uint32(s[3]), uint32(s[4]))
}

func hostGetBufferStatus(v *vm, s []uint64) status {
	data, ok := v.buffer(uint32(s[0]))
	if !ok {
		return statusNotFound
	}
	// CPPHOST get_buffer_status writes flags 0.
	if !v.writeU32(uint32(s[1]), uint32(len(data))) || !v.writeU32(uint32(s[2]), 0) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostSetBufferBytes(v *vm, s []uint64) status {
	t := uint32(s[0])
	st := v.effectiveStream()
	if st == nil || (t != bufRequestBody && t != bufResponseBody) {
		return statusNotFound
	}
	val, ok := v.read(uint32(s[3]), uint32(s[4]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	buf := &st.reqBody
	if t == bufResponseBody {
		buf = &st.respBody
	}
	start, length := int(uint32(s[1])), int(uint32(s[2]))
	// Envoy BufferWrapper::copyFrom (ENVOY-CTX): start 0 drains `length`
	// bytes and prepends; start ≥ size appends; anything else is
	// BAD_ARGUMENT.
	switch {
	case start == 0:
		if length > len(*buf) {
			length = len(*buf)
		}
		*buf = append(append([]byte(nil), val...), (*buf)[length:]...)
	case start >= len(*buf):
		*buf = append(*buf, val...)
	default:
		return statusBadArgument
	}
	return statusOK
}
