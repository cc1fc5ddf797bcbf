package strictjson

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Writer builds compact, canonical JSON into a byte slice. It inserts the commas and
// colons; the caller supplies the structure in order:
//
//	var w strictjson.Writer
//	w.BeginObject()
//	w.AppendKey("limit")
//	w.AppendUint(10)
//	w.EndObject()
//	b := w.Bytes() // {"limit":10}
//
// The zero Writer is ready to use. A Writer does not check that the calls make a
// well-formed document (a key outside an object, say); the encoder that drives it is
// responsible for that, and the tests of that encoder check it by decoding the output.
type Writer struct {
	buf   []byte
	comma bool // the next value or key needs a ',' before it
}

// NewWriter returns a Writer that appends to buf (which may be nil).
func NewWriter(buf []byte) *Writer { return &Writer{buf: buf} }

// Bytes returns the document written so far; it aliases the Writer's buffer.
func (w *Writer) Bytes() []byte { return w.buf }

func (w *Writer) sep() {
	if w.comma {
		w.buf = append(w.buf, ',')
	}
	w.comma = true
}

// BeginObject writes '{'.
func (w *Writer) BeginObject() {
	w.sep()
	w.buf = append(w.buf, '{')
	w.comma = false
}

// EndObject writes '}'.
func (w *Writer) EndObject() {
	w.buf = append(w.buf, '}')
	w.comma = true
}

// BeginArray writes '['.
func (w *Writer) BeginArray() {
	w.sep()
	w.buf = append(w.buf, '[')
	w.comma = false
}

// EndArray writes ']'.
func (w *Writer) EndArray() {
	w.buf = append(w.buf, ']')
	w.comma = true
}

// AppendKey writes an object key and the ':' after it.
func (w *Writer) AppendKey(k string) {
	w.sep()
	w.buf = AppendString(w.buf, k)
	w.buf = append(w.buf, ':')
	w.comma = false
}

// AppendString writes a string value, escaped as by the package-level [AppendString].
func (w *Writer) AppendString(s string) {
	w.sep()
	w.buf = AppendString(w.buf, s)
}

// AppendUint writes a non-negative integer in decimal.
func (w *Writer) AppendUint(v uint64) {
	w.sep()
	w.buf = strconv.AppendUint(w.buf, v, 10)
}

// AppendInt writes an integer in decimal.
func (w *Writer) AppendInt(v int64) {
	w.sep()
	w.buf = strconv.AppendInt(w.buf, v, 10)
}

// AppendBool writes true or false.
func (w *Writer) AppendBool(v bool) {
	w.sep()
	w.buf = strconv.AppendBool(w.buf, v)
}

// AppendNull writes null.
func (w *Writer) AppendNull() {
	w.sep()
	w.buf = append(w.buf, "null"...)
}

// AppendDuration writes a duration as a string, in the form of the package-level
// [AppendDuration].
func (w *Writer) AppendDuration(v time.Duration) {
	w.sep()
	w.buf = AppendDuration(w.buf, v)
}

// AppendRaw writes text that the caller guarantees is one valid JSON value, such as
// a number literal returned by [Decoder.Number].
func (w *Writer) AppendRaw(text string) {
	w.sep()
	w.buf = append(w.buf, text...)
}

const hexDigits = "0123456789abcdef"

// plain[c] reports whether AppendString copies byte c as is wherever it
// appears: printable ASCII other than '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainWord reports whether each of the eight bytes of x is plain (the plain
// table): none is below 0x20, '"', '\\' or 0x80 and above. It uses the byte
// tests of Sean Eron Anderson's "Bit Twiddling Hacks" ("Determine if a word has
// a byte less than n", "... has a zero byte"), which are exact for whether any
// byte matches (a byte's own result may be wrong, which this never reads).
func plainWord(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	below := (x - 0x20*lo) &^ x
	quote := x ^ '"'*lo
	backslash := x ^ '\\'*lo
	return (below|(quote-lo)&^quote|(backslash-lo)&^backslash|x)&hi == 0
}

// AppendString appends s to dst as a JSON string (RFC 8259 §7) in canonical form: '"'
// and '\\' escaped with a backslash; \b, \f, \n, \r, \t for those controls; every
// other byte below 0x20, and U+2028 and U+2029 (which break JavaScript string
// literals), as \u00XX-style escapes with lowercase hex; everything else as is. Bytes
// that are not valid UTF-8 are replaced by U+FFFD, so the output is always valid.
func AppendString(dst []byte, s string) []byte {
	// Most strings (keys, ids, trace ids) need no escape: find the first
	// byte that does eight bytes at a time (plainWord), then with one table
	// load per byte, and copy the rest whole.
	i := 0
	for ; i+8 <= len(s); i += 8 {
		// One 8-byte load: the compiler combines the byte loads (its
		// memcombine pass, on targets that allow unaligned loads).
		_ = s[i+7]
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if !plainWord(x) {
			break
		}
	}
	for i < len(s) && plain[s[i]] {
		i++
	}
	dst = append(dst, '"')
	if i == len(s) {
		dst = append(dst, s...)
		return append(dst, '"')
	}
	start := 0
	for i < len(s) {
		c := s[i]
		if plain[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += n
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += n
			start = i
			continue
		}
		i += n
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendDuration appends v as a JSON string in time.Duration.String form with
// trailing zero units dropped, so that common values read as written: 5m, 24h, 1h30m,
// 1.5s, 300ms, 0s. time.ParseDuration reads the result back to exactly v.
func AppendDuration(dst []byte, v time.Duration) []byte {
	dst = append(dst, '"')
	dst = append(dst, FormatDuration(v)...)
	return append(dst, '"')
}

// FormatDuration returns v in the canonical short form used by [AppendDuration].
func FormatDuration(v time.Duration) string {
	s := v.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
