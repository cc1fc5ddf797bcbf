package host

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// property resolves a proxy_get_property path as Envoy does
// (ENVOY-CTX Context::getProperty / findValue; Envoy's attributes doc):
// CEL attributes first, then the Wasm tokens plugin_name,
// plugin_root_id, plugin_vm_id, then filter state "wasm.<name>". Values
// use Envoy's encodings (§1.5): strings raw, integers 8 bytes
// little-endian, maps as pairs.
func (v *vm) property(path []string) ([]byte, status) {
	if len(path) == 3 && path[0] == "xds" && path[1] == "node" && path[2] == "id" && v.h.cfg.NodeID != "" {
		return []byte(v.h.cfg.NodeID), statusOK
	}
	st := v.effectiveStream()
	if st != nil {
		if val, ok, handled := st.attribute(path); handled {
			if !ok {
				return nil, statusNotFound
			}
			return val, statusOK
		}
	} else if isAttributeRoot(path[0]) {
		return nil, statusNotFound // root contexts have no stream info
	}
	if len(path) == 1 {
		switch path[0] {
		case "plugin_name":
			return []byte(v.h.cfg.PluginName), statusOK
		case "plugin_root_id":
			return []byte(v.h.cfg.RootID), statusOK
		case "plugin_vm_id":
			return []byte(v.h.cfg.VMID), statusOK
		}
	}
	if st != nil {
		if path[0] == "connection_id" && len(path) == 1 {
			return u64le(st.info.ConnectionID), statusOK
		}
		// Filter state fallback: the raw path (NULs included) as set.
		if val, ok := st.filterState["wasm."+strings.Join(path, "\x00")]; ok {
			return append([]byte(nil), val...), statusOK
		}
	}
	return nil, statusNotFound
}

func isAttributeRoot(s string) bool {
	switch s {
	case "request", "response", "source", "destination", "connection", "upstream",
		"metadata", "filter_state", "upstream_filter_state", "xds":
		return true
	}
	return false
}

func u64le(v uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return b[:]
}

// attribute answers CEL attributes; handled is false if path[0] is not
// an attribute root.
func (st *stream) attribute(path []string) (val []byte, ok, handled bool) {
	if !isAttributeRoot(path[0]) {
		return nil, false, false
	}
	if len(path) < 2 {
		return nil, false, true // whole-message attributes are not emulated
	}
	str := func(s string, present bool) ([]byte, bool, bool) { return []byte(s), present, true }
	switch path[0] {
	case "request":
		if !st.hasReqHeaders {
			return nil, false, true
		}
		h := st.reqHeaders
		switch path[1] {
		case "path":
			return str(h.Lookup(":path"))
		case "url_path":
			p, ok := h.Lookup(":path")
			if i := strings.IndexByte(p, '?'); i >= 0 {
				p = p[:i]
			}
			return str(p, ok)
		case "query":
			p, ok := h.Lookup(":path")
			q := ""
			if i := strings.IndexByte(p, '?'); i >= 0 {
				q = p[i+1:]
			}
			return str(q, ok)
		case "host":
			return str(h.Lookup(":authority"))
		case "scheme":
			return str(h.Lookup(":scheme"))
		case "method":
			return str(h.Lookup(":method"))
		case "id":
			return str(h.Lookup("x-request-id"))
		case "useragent":
			return str(h.Lookup("user-agent"))
		case "referer":
			return str(h.Lookup("referer"))
		case "protocol":
			return str(st.info.Protocol, true)
		case "time":
			return u64le(uint64(st.start.UnixNano())), true, true
		case "headers":
			return headerAttr(h, path[2:])
		}
	case "response":
		if !st.hasRespHeaders {
			return nil, false, true
		}
		switch path[1] {
		case "code":
			c, err := strconv.Atoi(st.respHeaders.Get(":status"))
			return u64le(uint64(int64(c))), err == nil, true
		case "code_details":
			return str(st.codeDetails, true)
		case "headers":
			return headerAttr(st.respHeaders, path[2:])
		case "trailers":
			if !st.hasRespTrailers {
				return nil, false, true
			}
			return headerAttr(st.respTrailers, path[2:])
		}
	case "source", "destination":
		addr := st.info.SourceAddress
		if path[0] == "destination" {
			addr = st.info.DestinationAddress
		}
		switch path[1] {
		case "address":
			// Address::asStringView: "ip:port" (envoy
			// source/extensions/filters/common/expr/context.cc).
			return str(addr, addr != "")
		case "port":
			_, p, err := net.SplitHostPort(addr)
			n, err2 := strconv.Atoi(p)
			return u64le(uint64(int64(n))), err == nil && err2 == nil, true
		}
	case "connection":
		if path[1] == "id" {
			return u64le(st.info.ConnectionID), true, true
		}
	}
	return nil, false, true
}

// headerAttr is request.headers / response.headers: the whole map as
// pairs with repeated values comma-joined, or one header's value.
func headerAttr(h Headers, rest []string) ([]byte, bool, bool) {
	if len(rest) == 0 {
		var joined Headers
		idx := map[string]int{}
		for _, kv := range h {
			if i, ok := idx[kv[0]]; ok {
				joined[i][1] += "," + kv[1]
				continue
			}
			idx[kv[0]] = len(joined)
			joined = append(joined, kv)
		}
		return encodePairs(joined), true, true
	}
	vals := h.Values(strings.ToLower(rest[0]))
	if len(vals) == 0 {
		return nil, false, true
	}
	return []byte(strings.Join(vals, ",")), true, true
}

func hostGetProperty(v *vm, s []uint64) status {
	path, ok := v.readString(uint32(s[0]), uint32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	val, st := v.property(strings.Split(path, "\x00"))
	if st != statusOK {
		return st
	}
	return v.copyOut(val, uint32(s[2]), uint32(s[3]))
}

func hostSetProperty(v *vm, s []uint64) status {
	path, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	val, ok2 := v.read(uint32(s[2]), uint32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	st := v.effectiveStream()
	if st == nil {
		// ENVOY-CTX setProperty needs the stream info: NOT_FOUND on a root
		// context.
		return statusNotFound
	}
	// Filter state "wasm." + raw path bytes (NULs included), a Bytes
	// CelState (ENVOY-CTX Context::setProperty).
	st.filterState["wasm."+path] = append([]byte(nil), val...)
	return statusOK
}
