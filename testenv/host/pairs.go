package host

import "encoding/binary"

// The proxy-wasm map serialization, written here from the host's side and on
// purpose apart from the guest's codec (filter/proxywasm/pairs): this host stands
// in for Envoy, so it must catch a guest that gets the format wrong, which a codec
// shared with the guest could not. It follows the proxy-wasm ABI v0.2.1 spec,
// section "Serialization"
// (https://github.com/proxy-wasm/spec/blob/master/abi-versions/v0.2.1/README.md),
// and proxy-wasm-cpp-host's src/pairs_util.cc (PairsUtil::marshalPairs, toPairs)
// with the limits of include/proxy-wasm/limits.h. All integers are 32-bit
// little-endian:
//
//	u32 N
//	N × (u32 key_len, u32 value_len)
//	N × (key bytes, 0x00, value bytes, 0x00)

const (
	// pairsMaxBytes is PROXY_WASM_HOST_PAIRS_MAX_BYTES: 1 MiB.
	pairsMaxBytes = 1 << 20
	// pairsMaxCount is PROXY_WASM_HOST_PAIRS_MAX_COUNT.
	pairsMaxCount = 1024
)

// encodePairs serializes m as cpp-host's marshalPairs does.
func encodePairs(m [][2]string) []byte {
	size := 4
	for _, kv := range m {
		size += 8 + len(kv[0]) + 1 + len(kv[1]) + 1
	}
	b := make([]byte, 4+8*len(m), size)
	binary.LittleEndian.PutUint32(b, uint32(len(m)))
	for i, kv := range m {
		binary.LittleEndian.PutUint32(b[4+8*i:], uint32(len(kv[0])))
		binary.LittleEndian.PutUint32(b[8+8*i:], uint32(len(kv[1])))
	}
	for _, kv := range m {
		b = append(b, kv[0]...)
		b = append(b, 0)
		b = append(b, kv[1]...)
		b = append(b, 0)
	}
	return b
}

// decodePairs parses a serialized map, copying every key and value out of b (a
// view of guest memory). Zero or one byte is the empty map. It reports false for
// input cpp-host's toPairs refuses: over pairsMaxBytes or pairsMaxCount, a count
// or length that runs past the end, a key or value without its NUL, or bytes left
// after the last pair.
func decodePairs(b []byte) ([][2]string, bool) {
	if len(b) <= 1 {
		return nil, true
	}
	if len(b) > pairsMaxBytes || len(b) < 4 {
		return nil, false
	}
	n := binary.LittleEndian.Uint32(b)
	if n > pairsMaxCount || 4+8*int(n) > len(b) {
		return nil, false
	}
	out := make([][2]string, n)
	pos := 4 + 8*int(n)
	for i := range out {
		for j, off := range [2]int{4 + 8*i, 8 + 8*i} {
			size := int(binary.LittleEndian.Uint32(b[off:])) // < 2^32: fits an int
			if size >= len(b) || pos+size >= len(b) || b[pos+size] != 0 {
				return nil, false
			}
			out[i][j] = string(b[pos : pos+size])
			pos += size + 1
		}
	}
	return out, pos == len(b)
}
