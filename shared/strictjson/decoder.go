package strictjson

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Limits bound what a [Decoder] accepts. A zero field means the default.
type Limits struct {
	// MaxBytes is the largest document accepted, in bytes (default [DefaultMaxBytes]).
	MaxBytes int
	// MaxDepth is the deepest nesting of arrays and objects accepted; the top-level
	// value of `{"a":[1]}` is at depth 1 and the array at depth 2 (default
	// [DefaultMaxDepth]).
	MaxDepth int
}

const (
	// DefaultMaxBytes is the document size limit used when Limits.MaxBytes is 0: 1 MiB.
	DefaultMaxBytes = 1 << 20
	// DefaultMaxDepth is the nesting limit used when Limits.MaxDepth is 0.
	DefaultMaxDepth = 32
	// MaxErrors is how many value errors a Decoder records before it stops with a
	// syntax error ("too many errors"), so a hostile document cannot make it build an
	// unbounded error list.
	MaxErrors = 100
)

// Kind is the type of the next JSON value, as reported by [Decoder.Peek].
type Kind uint8

// The kinds of JSON value (RFC 8259 §3). Invalid means the input is not at the start
// of a value (end of input, or a byte that cannot start one).
const (
	Invalid Kind = iota
	Null
	Bool
	Number
	String
	Array
	Object
)

type pathElem struct {
	key   string // valid when index == -1
	index int    // array index, -1 for a key, pendingKey before a key is read
}

// pendingKey marks an object whose next key is not read yet; the path names the object.
const pendingKey = -2

// Decoder reads one JSON document from a byte slice. Create it with [NewDecoder],
// read the top-level value with one of its methods, then call [Decoder.End]. A Decoder
// is not safe for concurrent use. See the package documentation for the error model.
type Decoder struct {
	data  []byte
	pos   int
	lim   Limits
	depth int
	path  []pathElem
	errs  []*Error
	stop  error // sticky: a syntax error or an error returned by a callback
	// foreign is set when stop came from a callback and is not one of errs.
	foreign bool
	buf     []byte
}

// NewDecoder returns a Decoder over data. The decoder does not copy data; strings it
// returns never alias it. If data is larger than lim.MaxBytes, the first read fails.
func NewDecoder(data []byte, lim Limits) *Decoder {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxDepth <= 0 {
		lim.MaxDepth = DefaultMaxDepth
	}
	d := &Decoder{data: data, lim: lim}
	if len(data) > lim.MaxBytes {
		d.syntaxAt(0, "document is "+strconv.Itoa(len(data))+" bytes, more than the limit of "+strconv.Itoa(lim.MaxBytes))
	}
	return d
}

// Path returns the JSON path of the value being read, such as "rules[2].window"; the
// top-level value has the path "". Keys that are not plain identifiers are quoted:
// `headers["x y"]`.
func (d *Decoder) Path() string { return renderPath(d.path) }

// Errors returns every error recorded so far, in document order: the value errors,
// then the syntax error or callback error that stopped decoding, if any. It returns nil
// when the document was read without problems.
func (d *Decoder) Errors() []*Error {
	return d.errs
}

// Err returns nil if no error was recorded, the only error if there is one, and an
// [ErrorList] otherwise.
//
// If a callback stopped decoding by returning an error of its own, Err returns that
// error unchanged.
func (d *Decoder) Err() error {
	if d.foreign {
		return d.stop
	}
	switch len(d.errs) {
	case 0:
		return nil
	case 1:
		return d.errs[0]
	}
	return ErrorList(d.errs)
}

// Fail records a value error with message msg at the current path and returns it. A
// caller uses it for problems it finds in a value it has read (a bad enum string, say)
// so they are reported in the same list, in document order, as the decoder's own.
func (d *Decoder) Fail(msg string) *Error {
	e := &Error{Path: d.Path(), Message: msg, Offset: d.pos}
	d.record(e)
	return e
}

// UnknownField skips the current value and records the error "unknown field" at its
// path. It returns an error only if decoding must stop (the value is malformed), so
// an [Decoder.Object] callback can end with `return d.UnknownField()` in its default
// branch. (A callback that does not read the value gets the same effect.)
func (d *Decoder) UnknownField() error {
	start := d.pos
	if err := d.Skip(); err != nil {
		return err
	}
	d.recordAt(start, "unknown field")
	return d.stop
}

// End checks that nothing but whitespace follows the top-level value, and returns
// [Decoder.Err].
func (d *Decoder) End() error {
	if d.stop == nil {
		d.skipWS()
		if d.pos < len(d.data) {
			d.syntax("unexpected data after the top-level value")
		}
	}
	return d.Err()
}

// Peek returns the kind of the next value without consuming it. It returns Invalid
// after a syntax error.
func (d *Decoder) Peek() Kind {
	if d.stop != nil {
		return Invalid
	}
	d.skipWS()
	if d.pos >= len(d.data) {
		return Invalid
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return Object
	case c == '[':
		return Array
	case c == '"':
		return String
	case c == 't' || c == 'f':
		return Bool
	case c == 'n':
		return Null
	case c == '-' || (c >= '0' && c <= '9'):
		return Number
	}
	return Invalid
}

// Object reads an object, calling fn once per member with the member's key while the
// decoder's path names that member; fn must read the member's value with one of the
// decoder's methods. If fn returns without reading the value, the value is skipped
// and recorded as an unknown field. A duplicate key is a syntax error. If the next
// value is not an object, Object skips it and records "must be an object". If fn
// returns an error, decoding stops and every later call returns it.
//
// Object returns an error only when decoding stops (a syntax error, or fn's error),
// so a callback may simply return the result of a nested Object or Array; value
// errors are recorded (see [Decoder.Errors]) and decoding goes on.
func (d *Decoder) Object(fn func(key string) error) error {
	if !d.expect('{', "must be an object") {
		return d.stop
	}
	if !d.enter() {
		return d.stop
	}
	d.pos++
	d.path = append(d.path, pathElem{index: pendingKey})
	top := len(d.path) - 1
	var small [8]string
	seen := small[:0]
	var seenMap map[string]struct{}
	d.skipWS()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		d.leave()
		return nil
	}
	for {
		d.skipWS()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			d.syntax("expected a string (an object key)")
			return d.stop
		}
		keyOff := d.pos
		key, ok := d.readString()
		if !ok {
			return d.stop
		}
		d.path[top] = pathElem{key: key, index: -1}
		if seenMap != nil {
			if _, dup := seenMap[key]; dup {
				d.syntaxAt(keyOff, "duplicate key")
				return d.stop
			}
			seenMap[key] = struct{}{}
		} else {
			for _, k := range seen {
				if k == key {
					d.syntaxAt(keyOff, "duplicate key")
					return d.stop
				}
			}
			if len(seen) < 32 {
				seen = append(seen, key)
			} else {
				seenMap = make(map[string]struct{}, 64)
				for _, k := range seen {
					seenMap[k] = struct{}{}
				}
				seenMap[key] = struct{}{}
			}
		}
		d.skipWS()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			d.syntax("expected ':' after an object key")
			return d.stop
		}
		d.pos++
		d.skipWS()
		before := d.pos
		if err := fn(key); err != nil {
			d.abort(err)
			return d.stop
		}
		if d.stop != nil {
			return d.stop
		}
		if d.pos == before {
			if err := d.UnknownField(); err != nil {
				return err
			}
		}
		d.skipWS()
		if d.pos >= len(d.data) {
			d.syntax("unexpected end of input in an object")
			return d.stop
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
			d.path[top] = pathElem{index: pendingKey}
		case '}':
			d.pos++
			d.leave()
			return nil
		default:
			d.syntax("expected ',' or '}' after an object member")
			return d.stop
		}
	}
}

// Array reads an array, calling fn with each element's index while the decoder's
// path names that element; fn must read the element with one of the decoder's
// methods (if it does not, the element is skipped and recorded as "unexpected
// value"). If the next value is not an array, Array skips it and records "must be
// an array". If fn returns an error, decoding stops. Like Object, Array returns an
// error only when decoding stops.
func (d *Decoder) Array(fn func(i int) error) error {
	if !d.expect('[', "must be an array") {
		return d.stop
	}
	if !d.enter() {
		return d.stop
	}
	d.pos++
	d.path = append(d.path, pathElem{index: 0})
	top := len(d.path) - 1
	d.skipWS()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		d.leave()
		return nil
	}
	for i := 0; ; i++ {
		d.path[top] = pathElem{index: i}
		d.skipWS()
		before := d.pos
		if err := fn(i); err != nil {
			d.abort(err)
			return d.stop
		}
		if d.stop != nil {
			return d.stop
		}
		if d.pos == before {
			if err := d.Skip(); err != nil {
				return err
			}
			d.recordAt(before, "unexpected value")
		}
		d.skipWS()
		if d.pos >= len(d.data) {
			d.syntax("unexpected end of input in an array")
			return d.stop
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			d.leave()
			return nil
		default:
			d.syntax("expected ',' or ']' after an array element")
			return d.stop
		}
	}
}

// String reads a string. Escapes are decoded; the result is valid UTF-8. If the next
// value is not a string, it is skipped and "must be a string" is recorded and returned.
func (d *Decoder) String() (string, error) {
	if !d.expect('"', "must be a string") {
		return "", d.current()
	}
	s, ok := d.readString()
	if !ok {
		return "", d.stop
	}
	return s, nil
}

// Bool reads true or false; anything else is skipped and "must be true or false" is
// recorded and returned.
func (d *Decoder) Bool() (bool, error) {
	if d.stop != nil {
		return false, d.stop
	}
	d.skipWS()
	if d.literal("true") {
		return true, nil
	}
	if d.literal("false") {
		return false, nil
	}
	return false, d.typeError("must be true or false")
}

// Null consumes the next value and returns true if it is null; otherwise it consumes
// nothing and returns false. Use it to treat null like an absent member.
func (d *Decoder) Null() bool {
	if d.stop != nil {
		return false
	}
	d.skipWS()
	return d.literal("null")
}

// Uint64 reads a non-negative integer that fits in a uint64 (0 to 18446744073709551615)
// exactly, without rounding through float64. A fraction or exponent ("1.0", "1e3")
// is rejected. On a mismatch the value is skipped and the error is recorded and
// returned.
func (d *Decoder) Uint64() (uint64, error) {
	return d.uint64("must be a non-negative integer", "must be a non-negative integer")
}

// CountUint64 is Uint64 for a quantity that must be positive: a negative number
// is refused with "must be > 0" (zero is read, for the caller's own check to refuse
// with the same words).
func (d *Decoder) CountUint64() (uint64, error) {
	return d.uint64("must be an integer > 0", "must be > 0")
}

// uint64 reads a non-negative integer; notNumber is the message for a value that
// is not a number, negative for a number below zero.
func (d *Decoder) uint64(notNumber, negative string) (uint64, error) {
	num, off, ok := d.number(notNumber)
	if !ok {
		return 0, d.current()
	}
	if num[0] == '-' {
		return 0, d.recordAt(off, negative)
	}
	if !isInteger(num) {
		return 0, d.recordAt(off, "must be an integer")
	}
	var v uint64
	for _, c := range num {
		digit := uint64(c - '0')
		if v > (^uint64(0)-digit)/10 {
			return 0, d.recordAt(off, "must be at most 18446744073709551615")
		}
		v = v*10 + digit
	}
	return v, nil
}

// Int64 reads an integer that fits in an int64 exactly (-9223372036854775808 to
// 9223372036854775807). A fraction or exponent is rejected. On a mismatch the value
// is skipped and the error is recorded and returned.
func (d *Decoder) Int64() (int64, error) {
	num, off, ok := d.number("must be an integer")
	if !ok {
		return 0, d.current()
	}
	if !isInteger(num) {
		return 0, d.recordAt(off, "must be an integer")
	}
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	limit := uint64(1<<63 - 1)
	if neg {
		limit = 1 << 63
	}
	var v uint64
	for _, c := range num {
		digit := uint64(c - '0')
		if v > (limit-digit)/10 {
			return 0, d.recordAt(off, "must be between -9223372036854775808 and 9223372036854775807")
		}
		v = v*10 + digit
	}
	if neg {
		return int64(-v), nil
	}
	return int64(v), nil
}

// Number reads any JSON number and returns its literal text as it appears in the
// document (RFC 8259 §6 grammar, already checked).
func (d *Decoder) Number() (string, error) {
	num, _, ok := d.number("must be a number")
	if !ok {
		return "", d.current()
	}
	return string(num), nil
}

// Duration reads a string in Go's time.ParseDuration syntax ("300ms", "1.5s", "5m",
// "24h", "1h30m"). A bare number is rejected, since its unit would be a guess. On a
// mismatch the value is skipped and the error is recorded and returned.
func (d *Decoder) Duration() (time.Duration, error) {
	if !d.expect('"', `must be a duration string such as "5m" or "1.5s"`) {
		return 0, d.current()
	}
	off := d.pos
	s, ok := d.readString()
	if !ok {
		return 0, d.stop
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, d.recordAt(off, `must be a duration string such as "5m" or "1.5s"`)
	}
	return v, nil
}

// Skip reads and discards the next value, checking its syntax and the depth limit.
func (d *Decoder) Skip() error {
	if d.stop != nil {
		return d.stop
	}
	d.skipWS()
	if d.pos >= len(d.data) {
		d.syntax("unexpected end of input, expected a value")
		return d.stop
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.Object(func(string) error { return d.Skip() })
	case c == '[':
		return d.Array(func(int) error { return d.Skip() })
	case c == '"':
		if _, ok := d.scanString(); !ok {
			return d.stop
		}
		return nil
	case c == 't':
		return d.lit("true")
	case c == 'f':
		return d.lit("false")
	case c == 'n':
		return d.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		if _, ok := d.scanNumber(); !ok {
			return d.stop
		}
		return nil
	}
	d.syntax("invalid character " + quoteByte(d.data[d.pos]) + " at the start of a value")
	return d.stop
}

// Raw reads the next value, checking it as [Decoder.Skip] does, and returns its bytes
// exactly as they stand in the document, without the white space around them (the
// role of encoding/json's RawMessage). The slice aliases the decoder's input and has
// no spare capacity, so appending to it never writes into the document. On an error
// it returns nil and the error that stopped decoding.
//
// Raw hands a member to a decoder of its own, for example an embedded document that
// another package parses with its own limits and error paths.
func (d *Decoder) Raw() ([]byte, error) {
	if d.stop != nil {
		return nil, d.stop
	}
	d.skipWS()
	start := d.pos
	if err := d.Skip(); err != nil {
		return nil, err
	}
	return d.data[start:d.pos:d.pos], nil
}

// ---- internals ----

func (d *Decoder) lit(word string) error {
	if !d.literal(word) {
		d.syntax("invalid literal, expected " + word)
		return d.stop
	}
	return nil
}

func (d *Decoder) literal(word string) bool {
	if len(d.data)-d.pos >= len(word) && string(d.data[d.pos:d.pos+len(word)]) == word {
		end := d.pos + len(word)
		if end < len(d.data) && isIdentByte(d.data[end]) {
			return false
		}
		d.pos = end
		return true
	}
	return false
}

func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// current returns the error that explains why the last expect failed: the sticky
// error, or the last recorded value error.
func (d *Decoder) current() error {
	if d.stop != nil {
		return d.stop
	}
	return d.errs[len(d.errs)-1]
}

// expect checks that the next value starts with c. If it does not, the value is
// skipped and msg recorded (a value error), or a syntax error is set.
func (d *Decoder) expect(c byte, msg string) bool {
	if d.stop != nil {
		return false
	}
	d.skipWS()
	if d.pos < len(d.data) && d.data[d.pos] == c {
		return true
	}
	d.typeError(msg)
	return false
}

// typeError skips the value at the current position (reporting a syntax error if it
// is malformed) and records msg for it.
func (d *Decoder) typeError(msg string) error {
	start := d.pos
	if err := d.Skip(); err != nil {
		return err
	}
	return d.recordAt(start, msg)
}

func (d *Decoder) number(msg string) (num []byte, off int, ok bool) {
	if d.stop != nil {
		return nil, 0, false
	}
	d.skipWS()
	off = d.pos
	if d.pos < len(d.data) {
		if c := d.data[d.pos]; c == '-' || (c >= '0' && c <= '9') {
			num, ok = d.scanNumber()
			return num, off, ok
		}
	}
	d.typeError(msg)
	return nil, off, false
}

func isInteger(num []byte) bool {
	for _, c := range num {
		if c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// scanNumber consumes a number per the RFC 8259 §6 grammar:
// -? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?
func (d *Decoder) scanNumber() ([]byte, bool) {
	b, i := d.data, d.pos
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		d.syntaxAt(i, "invalid number")
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.syntaxAt(i, "invalid number: expected a digit after '.'")
			return nil, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.syntaxAt(i, "invalid number: expected a digit in the exponent")
			return nil, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (isIdentByte(b[i]) || b[i] == '.' || b[i] == '+' || b[i] == '-') {
		d.syntaxAt(i, "invalid number")
		return nil, false
	}
	d.pos = i
	return b[start:i], true
}

// scanString consumes a string starting at the opening quote and checks it. It
// returns whether the string contains escapes.
func (d *Decoder) scanString() (escaped bool, ok bool) {
	b := d.data
	i := d.pos + 1
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return escaped, true
		case c == '\\':
			escaped = true
			n, ok := d.checkEscape(i)
			if !ok {
				return false, false
			}
			i += n
		case c < 0x20:
			d.syntaxAt(i, "control character "+quoteByte(c)+" in a string must be escaped")
			return false, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				d.syntaxAt(i, "invalid UTF-8 in a string")
				return false, false
			}
			i += n
		}
	}
	d.syntaxAt(i, "unexpected end of input in a string")
	return false, false
}

// checkEscape validates the escape starting at b[i] == '\\' and returns its length.
func (d *Decoder) checkEscape(i int) (int, bool) {
	b := d.data
	if i+1 >= len(b) {
		d.syntaxAt(i, "unexpected end of input in a string")
		return 0, false
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, true
	case 'u':
		r, ok := hex4(b, i+2)
		if !ok {
			d.syntaxAt(i, `invalid \u escape`)
			return 0, false
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			lo, ok := hex4(b, i+8)
			if !ok || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
				d.syntaxAt(i, `invalid \u escape: unpaired surrogate`)
				return 0, false
			}
			return 12, true
		case r >= 0xDC00 && r <= 0xDFFF:
			d.syntaxAt(i, `invalid \u escape: unpaired surrogate`)
			return 0, false
		}
		return 6, true
	}
	d.syntaxAt(i, "invalid escape "+quoteByte(b[i+1])+" in a string")
	return 0, false
}

func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// readString consumes a string (at its opening quote) and returns it decoded.
func (d *Decoder) readString() (string, bool) {
	start := d.pos
	escaped, ok := d.scanString()
	if !ok {
		return "", false
	}
	raw := d.data[start+1 : d.pos-1]
	if !escaped {
		return string(raw), true
	}
	out := d.buf[:0]
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			out = append(out, raw[i+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _ := hex4(raw, i+2)
			if r >= 0xD800 && r < 0xDC00 {
				lo, _ := hex4(raw, i+8)
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		}
		i += 2
	}
	d.buf = out
	return string(out), true
}

func (d *Decoder) skipWS() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *Decoder) enter() bool {
	d.depth++
	if d.depth > d.lim.MaxDepth {
		d.syntax("nesting deeper than " + strconv.Itoa(d.lim.MaxDepth) + " levels")
		return false
	}
	return true
}

func (d *Decoder) leave() {
	d.depth--
	d.path = d.path[:len(d.path)-1]
}

func (d *Decoder) syntax(msg string) { d.syntaxAt(d.pos, msg) }

func (d *Decoder) syntaxAt(off int, msg string) {
	if d.stop != nil {
		return
	}
	e := &Error{Path: d.Path(), Message: msg, Offset: off, Syntax: true}
	d.stop = e
	d.errs = append(d.errs, e)
}

func (d *Decoder) recordAt(off int, msg string) *Error {
	e := &Error{Path: d.Path(), Message: msg, Offset: off}
	d.record(e)
	return e
}

func (d *Decoder) record(e *Error) {
	if d.stop != nil {
		return
	}
	if len(d.errs) >= MaxErrors {
		d.syntaxAt(e.Offset, "too many errors")
		return
	}
	d.errs = append(d.errs, e)
}

// abort makes err, returned by a callback, the sticky error unless one is set.
func (d *Decoder) abort(err error) {
	if d.stop != nil {
		return
	}
	d.stop = err
	if e, ok := err.(*Error); ok {
		for _, r := range d.errs {
			if r == e {
				return
			}
		}
	}
	d.foreign = true
}
