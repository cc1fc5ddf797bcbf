package rules

import (
	"encoding/base64"

	"github.com/sluice-proxy/sluice/shared/digest"
)

const upperHex = "0123456789ABCDEF"

// keySafe[c] is true for the bytes a counter key carries unescaped: printable ASCII
// except '%' (the escape), ':' (separates the key's fields), '|' (separates key
// parts) and '=' (separates a part's tag from its value).
var keySafe = func() (t [256]bool) {
	for c := 0x21; c < 0x7f; c++ {
		t[c] = true
	}
	t['%'], t[':'], t['|'], t['='] = false, false, false, false
	return t
}()

// appendEscaped appends s to dst with every byte that is not keySafe written as
// %XX (upper-case hex, as RFC 3986 percent-encoding). The mapping is injective and
// its output contains no ':', '|' or '='.
func appendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keySafe[c] {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xf])
	}
	return dst
}

// appendValue appends a key part's value: escaped (appendEscaped) when that is at
// most MaxKeyValueBytes long, else its digest, "%S" and the 43 base64url
// characters (RFC 4648 §5, unpadded) of the value's SHA-256, so a client's 60 KB
// header names a counter as a 45-byte value does. No escaped value starts with
// "%S" ('%' is always followed by two upper-case hex digits there), so the two
// forms cannot name the same counter, and the digest keeps distinct values
// distinct (a SHA-256 collision aside). It does not allocate when dst has room.
func appendValue[S ~string | ~[]byte](dst []byte, v S) []byte {
	if len(v) > MaxKeyValueBytes || len(v) > MaxKeyValueBytes/3 && escapedLen(v) > MaxKeyValueBytes {
		return appendDigest(dst, v)
	}
	return appendEscaped(dst, v)
}

// escapedLen returns the length of s escaped, or a number over MaxKeyValueBytes as
// soon as it is known to be over.
func escapedLen[S ~string | ~[]byte](s S) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !keySafe[s[i]] {
			n += 2
			if n > MaxKeyValueBytes {
				return n
			}
		}
	}
	return n
}

// appendDigest appends "%S" and the unpadded base64url SHA-256 of v.
func appendDigest[S ~string | ~[]byte](dst []byte, v S) []byte {
	sum := digest.Sum256(v)
	dst = append(dst, '%', 'S')
	return base64.RawURLEncoding.AppendEncode(dst, sum[:])
}
