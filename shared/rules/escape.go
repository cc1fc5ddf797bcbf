package rules

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
