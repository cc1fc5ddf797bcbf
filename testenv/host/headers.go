package host

import "strings"

// Header maps: the proxy_*_header_map_* hostcalls (spec v0.2.1 "HTTP fields").

// headerMap returns the map the guest addresses, or nil if it is not
// available now (Envoy then answers BAD_ARGUMENT, ENVOY-CTX getMap).
func (v *vm) headerMap(t uint32) *Headers {
	switch t {
	case mapRequestHeaders, mapRequestTrailers, mapResponseHeaders, mapResponseTrailers:
		st := v.effectiveStream()
		if st == nil {
			return nil
		}
		switch t {
		case mapRequestHeaders:
			if st.hasReqHeaders {
				return &st.reqHeaders
			}
		case mapRequestTrailers:
			if st.hasReqTrailers {
				return &st.reqTrailers
			}
		case mapResponseHeaders:
			if st.hasRespHeaders {
				return &st.respHeaders
			}
		case mapResponseTrailers:
			if st.hasRespTrailers {
				return &st.respTrailers
			}
		}
	case mapCallResponseHeaders:
		if v.callout != nil {
			return &v.callout.headers
		}
	case mapCallResponseTrailers:
		if v.callout != nil {
			return &v.callout.trailers
		}
	}
	return nil
}

func hostGetHeaderMapSize(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	if !v.writeU32(uint32(s[1]), uint32(m.byteSize())) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostGetHeaderMapPairs(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	if len(*m) == 0 {
		// CPPHOST get_header_map_pairs: an empty map is ptr 0, size 0.
		return v.copyOut(nil, uint32(s[1]), uint32(s[2]))
	}
	return v.copyOut(encodePairs(*m), uint32(s[1]), uint32(s[2]))
}

// writableHeaderMap is the header map t for a set, add, replace or remove,
// or nil (BAD_ARGUMENT) if t is unknown or an HTTP-call response map,
// which the guest may only read.
func (v *vm) writableHeaderMap(t uint32) *Headers {
	if t == mapCallResponseHeaders || t == mapCallResponseTrailers {
		return nil
	}
	return v.headerMap(t)
}

func hostSetHeaderMapPairs(v *vm, s []uint64) status {
	m := v.writableHeaderMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	raw, ok := v.read(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	ps, ok := decodePairs(raw)
	if !ok {
		// CPPHOST PairsUtil::toPairs: bad input is treated as an empty map.
		ps = nil
	}
	// ENVOY-CTX setHeaderMapPairs: remove every header, then add each.
	var out Headers
	for _, kv := range ps {
		out = out.add(strings.ToLower(kv[0]), kv[1])
	}
	*m = out
	return statusOK
}

func hostGetHeaderMapValue(v *vm, s []uint64) status {
	m := v.headerMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	key, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	key = strings.ToLower(key)
	// ENVOY-CTX getHeaderMapValue: the first value only; absent is
	// NOT_FOUND under ABI 0.2.x.
	for _, kv := range *m {
		if kv[0] == key {
			return v.copyOut([]byte(kv[1]), uint32(s[3]), uint32(s[4]))
		}
	}
	return statusNotFound
}

func hostModifyHeader(v *vm, s []uint64, op string) status {
	m := v.writableHeaderMap(uint32(s[0]))
	if m == nil {
		return statusBadArgument
	}
	key, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	key = strings.ToLower(key) // Envoy lower-cases keys on every set/add.
	var val string
	if op != "remove" {
		if val, ok = v.readString(uint32(s[3]), uint32(s[4])); !ok {
			return statusInvalidMemoryAccess
		}
	}
	switch op {
	case "add":
		*m = m.add(key, val)
	case "replace":
		// HeaderMap::setCopy: drop every entry of key, then add one.
		*m = m.remove(key).add(key, val)
	case "remove":
		*m = m.remove(key)
	}
	return statusOK
}
