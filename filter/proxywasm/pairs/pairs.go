// Package pairs implements the proxy-wasm map serialization used for header
// maps, trailers, HTTP call headers and local-reply headers.
//
// The format is defined in the proxy-wasm spec, abi-versions/v0.2.1,
// section "Serialization", and implemented by proxy-wasm-cpp-host in
// src/pairs_util.cc (PairsUtil::marshalPairs / toPairs). All integers are
// 32-bit little-endian:
//
//	u32 N
//	N × (u32 key_len, u32 value_len)
//	N × (key bytes, 0x00, value bytes, 0x00)
//
// An empty map may be sent as zero bytes or as a single byte; Envoy's
// proxy_get_header_map_pairs returns size 0 for an empty map.
//
// The guest (filter/proxywasm) uses this package; the wazero test host
// (testenv/host) has its own codec on purpose, so that a guest that gets the
// format wrong is caught, and a test holds the two to one format. It uses only
// the standard library and never panics on any input.
//
// # Errors
//
// Decode and DecodeString return a *DecodeError that wraps one of
// ErrTooLarge, ErrTooManyPairs, ErrTruncated, ErrLengthOverflow,
// ErrMissingNUL or ErrTrailingData; test with errors.Is.
package pairs

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// Limits mirror proxy-wasm-cpp-host include/proxy-wasm/limits.h, where the
// host silently treats larger input as an empty map.
const (
	// MaxBytes is the largest serialized map accepted, in bytes (1 MiB,
	// PROXY_WASM_HOST_PAIRS_MAX_BYTES).
	MaxBytes = 1 << 20
	// MaxCount is the largest number of pairs accepted
	// (PROXY_WASM_HOST_PAIRS_MAX_COUNT).
	MaxCount = 1024
)

// Sentinel errors wrapped by *DecodeError.
var (
	// ErrTooLarge: the input is longer than MaxBytes bytes.
	ErrTooLarge = errors.New("pairs: input exceeds 1 MiB")
	// ErrTooManyPairs: the declared pair count N is above MaxCount.
	ErrTooManyPairs = errors.New("pairs: more than 1024 pairs")
	// ErrTruncated: the input ends before the count, the length table or a
	// key/value it declares.
	ErrTruncated = errors.New("pairs: truncated input")
	// ErrLengthOverflow: a key or value length (with its NUL) cannot fit in
	// any input of at most MaxBytes bytes, e.g. 0xFFFFFFFF.
	ErrLengthOverflow = errors.New("pairs: key or value length overflows")
	// ErrMissingNUL: the byte after a key or value is not 0x00.
	ErrMissingNUL = errors.New("pairs: missing NUL terminator")
	// ErrTrailingData: bytes remain after the N declared pairs, so the
	// count disagrees with the size.
	ErrTrailingData = errors.New("pairs: trailing bytes after last pair")
)

// DecodeError reports where decoding failed. Err is one of the package's
// sentinel errors; Offset is the byte offset in the input at which the
// problem was found.
type DecodeError struct {
	Err    error
	Offset int
}

// Error returns e.g. "pairs: truncated input (at byte 12)".
func (e *DecodeError) Error() string {
	return e.Err.Error() + " (at byte " + strconv.Itoa(e.Offset) + ")"
}

// Unwrap returns the sentinel error, for errors.Is.
func (e *DecodeError) Unwrap() error { return e.Err }

func fail(err error, off int) error { return &DecodeError{Err: err, Offset: off} }

// Size returns the serialized size of pairs in bytes:
// 4 + Σ(8 + len(key) + 1 + len(value) + 1).
func Size(pairs [][2]string) int {
	n := 4
	for i := range pairs {
		n += 10 + len(pairs[i][0]) + len(pairs[i][1])
	}
	return n
}

// Encode serializes pairs into a new buffer of exactly Size(pairs) bytes.
// An empty or nil map encodes as the 4-byte count 0. Encode does not apply
// MaxBytes or MaxCount; a host will refuse (Envoy: treat as empty) a map
// that exceeds them.
func Encode(pairs [][2]string) []byte {
	return AppendEncode(make([]byte, 0, Size(pairs)), pairs)
}

// AppendEncode appends the serialization of pairs to dst and returns the
// extended slice, allocating only if dst lacks capacity.
func AppendEncode(dst []byte, pairs [][2]string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for i := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs[i][0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs[i][1])))
	}
	for i := range pairs {
		dst = append(dst, pairs[i][0]...)
		dst = append(dst, 0)
		dst = append(dst, pairs[i][1]...)
		dst = append(dst, 0)
	}
	return dst
}

// Decode parses a serialized map into key/value pairs in wire order.
// Size 0 and size 1 mean an empty map (nil, nil). The returned strings are
// copies (one allocation for all of them), so b may be reused afterwards,
// e.g. when it is a view of guest memory. See the package doc for errors.
func Decode(b []byte) ([][2]string, error) {
	if len(b) <= 1 {
		return nil, nil
	}
	if len(b) > MaxBytes {
		return nil, fail(ErrTooLarge, MaxBytes)
	}
	return DecodeString(string(b))
}

// DecodeString is Decode over a string: the returned keys and values are
// substrings of s and share its memory, so it allocates only the result
// slice. Use it when s is immutable or exclusively owned.
func DecodeString(s string) ([][2]string, error) {
	if len(s) <= 1 {
		return nil, nil
	}
	if len(s) > MaxBytes {
		return nil, fail(ErrTooLarge, MaxBytes)
	}
	if len(s) < 4 {
		return nil, fail(ErrTruncated, len(s))
	}
	n := u32(s, 0)
	if n > MaxCount {
		return nil, fail(ErrTooManyPairs, 0)
	}
	// n ≤ 1024, so the table end fits easily in an int.
	table := 4 + 8*int(n)
	if table > len(s) {
		return nil, fail(ErrTruncated, len(s))
	}
	if n == 0 {
		if len(s) != 4 {
			return nil, fail(ErrTrailingData, 4)
		}
		return nil, nil
	}
	out := make([][2]string, n)
	pos := table
	for i := 0; i < int(n); i++ {
		klen := u32(s, 4+8*i)
		vlen := u32(s, 8+8*i)
		var err error
		if out[i][0], pos, err = field(s, pos, klen); err != nil {
			return nil, err
		}
		if out[i][1], pos, err = field(s, pos, vlen); err != nil {
			return nil, err
		}
	}
	if pos != len(s) {
		return nil, fail(ErrTrailingData, pos)
	}
	return out, nil
}

// field reads size bytes at pos followed by a NUL and returns the bytes and
// the position after the NUL.
func field(s string, pos int, size uint32) (string, int, error) {
	if size >= MaxBytes {
		return "", pos, fail(ErrLengthOverflow, pos)
	}
	end := pos + int(size) // both < 2^21: no overflow
	if end >= len(s) {
		return "", pos, fail(ErrTruncated, len(s))
	}
	if s[end] != 0 {
		return "", pos, fail(ErrMissingNUL, end)
	}
	return s[pos:end], end + 1, nil
}

func u32(s string, off int) uint32 {
	return uint32(s[off]) | uint32(s[off+1])<<8 | uint32(s[off+2])<<16 | uint32(s[off+3])<<24
}
