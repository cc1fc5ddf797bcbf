package strictjson

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// value is a generic JSON tree used by the tests to decode anything and re-encode it.
type value struct {
	kind  Kind
	b     bool
	num   string
	str   string
	arr   []value
	keys  []string
	elems []value
}

func decodeValue(d *Decoder) (value, error) {
	switch d.Peek() {
	case Null:
		if d.Null() {
			return value{kind: Null}, nil
		}
	case Bool:
		b, err := d.Bool()
		return value{kind: Bool, b: b}, err
	case Number:
		n, err := d.Number()
		return value{kind: Number, num: n}, err
	case String:
		s, err := d.String()
		return value{kind: String, str: s}, err
	case Array:
		v := value{kind: Array}
		err := d.Array(func(int) error {
			e, err := decodeValue(d)
			v.arr = append(v.arr, e)
			return err
		})
		return v, err
	case Object:
		v := value{kind: Object}
		err := d.Object(func(k string) error {
			e, err := decodeValue(d)
			v.keys = append(v.keys, k)
			v.elems = append(v.elems, e)
			return err
		})
		return v, err
	}
	return value{}, d.Skip()
}

func (v *value) write(w *Writer) {
	switch v.kind {
	case Null:
		w.AppendNull()
	case Bool:
		w.AppendBool(v.b)
	case Number:
		w.AppendRaw(v.num)
	case String:
		w.AppendString(v.str)
	case Array:
		w.BeginArray()
		for i := range v.arr {
			v.arr[i].write(w)
		}
		w.EndArray()
	case Object:
		w.BeginObject()
		for i, k := range v.keys {
			w.AppendKey(k)
			v.elems[i].write(w)
		}
		w.EndObject()
	}
}

func parseAll(doc string, lim Limits) (value, error) {
	d := NewDecoder([]byte(doc), lim)
	v, _ := decodeValue(d)
	return v, d.End()
}

func reencode(t testing.TB, doc string) string {
	t.Helper()
	v, err := parseAll(doc, Limits{})
	if err != nil {
		t.Fatalf("decode %q: %v", doc, err)
	}
	var w Writer
	v.write(&w)
	return string(w.Bytes())
}

func TestCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{` { "a" : [ 1 , -2.5e+3 , true , false , null ] , "b" : { } , "c" : [ ] } `, `{"a":[1,-2.5e+3,true,false,null],"b":{},"c":[]}`},
		{`"\u0041\/\b\f\n\r\t\"\\"`, `"A/\b\f\n\r\t\"\\"`},
		{`"\u0001\u001f\u007f"`, "\"\\u0001\\u001f\x7f\""},
		{`"\u2028\u2029"`, `"\u2028\u2029"`},
		{`"é😀\ud83d\ude00"`, `"é😀😀"`},
		{`"<&>"`, `"<&>"`},
		{`0`, `0`},
		{`-0`, `-0`},
		{`""`, `""`},
	}
	for _, tt := range tests {
		if got := reencode(t, tt.in); got != tt.want {
			t.Errorf("reencode(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestAppendStringInvalidUTF8(t *testing.T) {
	if got := string(AppendString(nil, "a\xffb")); got != `"a\ufffdb"` {
		t.Errorf("got %s", got)
	}
}

func TestDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Minute:            "5m",
		24 * time.Hour:             "24h",
		90 * time.Minute:           "1h30m",
		time.Hour + 30*time.Second: "1h0m30s",
		1500 * time.Millisecond:    "1.5s",
		300 * time.Millisecond:     "300ms",
		10 * time.Second:           "10s",
		0:                          "0s",
		time.Microsecond:           "1µs",
		-time.Minute:               "-1m",
	} {
		got := FormatDuration(d)
		if got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		back, err := time.ParseDuration(got)
		if err != nil || back != d {
			t.Errorf("ParseDuration(%q) = %v, %v", got, back, err)
		}
	}
	d := NewDecoder([]byte(`["5m","1.5s",60,"x"]`), Limits{})
	var got []time.Duration
	_ = d.Array(func(int) error {
		v, _ := d.Duration()
		got = append(got, v)
		return nil
	})
	err := d.End()
	want := `[2]: must be a duration string such as "5m" or "1.5s"; [3]: must be a duration string such as "5m" or "1.5s"`
	if err == nil || err.Error() != want || got[0] != 5*time.Minute || got[1] != 1500*time.Millisecond {
		t.Errorf("got %v, %v", got, err)
	}
}

func TestIntegers(t *testing.T) {
	tests := []struct {
		in   string
		u    uint64
		uErr string
		i    int64
		iErr string
	}{
		{in: "0", u: 0, i: 0},
		{in: "18446744073709551615", u: 1<<64 - 1, iErr: "must be between -9223372036854775808 and 9223372036854775807"},
		{in: "18446744073709551616", uErr: "must be at most 18446744073709551615", iErr: "must be between -9223372036854775808 and 9223372036854775807"},
		{in: "9223372036854775807", u: 1<<63 - 1, i: 1<<63 - 1},
		{in: "-9223372036854775808", uErr: "must be a non-negative integer", i: -1 << 63},
		{in: "-9223372036854775809", uErr: "must be a non-negative integer", iErr: "must be between -9223372036854775808 and 9223372036854775807"},
		{in: "9007199254740993", u: 9007199254740993, i: 9007199254740993}, // 2^53+1: no float rounding
		{in: "1.0", uErr: "must be an integer", iErr: "must be an integer"},
		{in: "1e2", uErr: "must be an integer", iErr: "must be an integer"},
		{in: `"1"`, uErr: "must be a non-negative integer", iErr: "must be an integer"},
		{in: `true`, uErr: "must be a non-negative integer", iErr: "must be an integer"},
	}
	for _, tt := range tests {
		d := NewDecoder([]byte(tt.in), Limits{})
		u, err := d.Uint64()
		if tt.uErr != "" {
			if err == nil || err.Error() != tt.uErr {
				t.Errorf("Uint64(%s) error = %v, want %s", tt.in, err, tt.uErr)
			}
		} else if err != nil || u != tt.u {
			t.Errorf("Uint64(%s) = %d, %v", tt.in, u, err)
		}
		d = NewDecoder([]byte(tt.in), Limits{})
		i, err := d.Int64()
		if tt.iErr != "" {
			if err == nil || err.Error() != tt.iErr {
				t.Errorf("Int64(%s) error = %v, want %s", tt.in, err, tt.iErr)
			}
		} else if err != nil || i != tt.i {
			t.Errorf("Int64(%s) = %d, %v", tt.in, i, err)
		}
	}
}

func TestSyntaxErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{``, "unexpected end of input, expected a value"},
		{`   `, "unexpected end of input, expected a value"},
		{`{`, "expected a string (an object key)"},
		{`{"a"}`, "a: expected ':' after an object key"},
		{`{"a":1,}`, "expected a string (an object key)"},
		{`{"a":1 "b":2}`, "a: expected ',' or '}' after an object member"},
		{`[1,]`, "[1]: invalid character ']' at the start of a value"},
		{`[1 2]`, "[0]: expected ',' or ']' after an array element"},
		{`[`, "[0]: unexpected end of input, expected a value"},
		{`{"a":1,"a":2}`, "a: duplicate key"},
		{`{"a":{"b":1,"b":1}}`, "a.b: duplicate key"},
		{`"abc`, "unexpected end of input in a string"},
		{`"\x"`, `invalid escape 'x' in a string`},
		{`"\u12"`, `invalid \u escape`},
		{`"\udc00"`, `invalid \u escape: unpaired surrogate`},
		{`"\ud800\u0041"`, `invalid \u escape: unpaired surrogate`},
		{"\"\x00\"", "control character 0x0 in a string must be escaped"},
		{"\"\xc3\x28\"", "invalid UTF-8 in a string"},
		{"\"\xed\xa0\x80\"", "invalid UTF-8 in a string"}, // encoded surrogate
		{`01`, "invalid number"},
		{`1.`, "invalid number: expected a digit after '.'"},
		{`1e`, "invalid number: expected a digit in the exponent"},
		{`-`, "invalid number"},
		{`+1`, "invalid character '+' at the start of a value"},
		{`.5`, "invalid character '.' at the start of a value"},
		{`NaN`, "invalid character 'N' at the start of a value"},
		{`1x`, "invalid number"},
		{`tru`, "invalid literal, expected true"},
		{`truex`, "invalid literal, expected true"},
		{`nul`, "invalid literal, expected null"},
		{`1 2`, "unexpected data after the top-level value"},
		{"\xef\xbb\xbf1", "invalid character 0xef at the start of a value"},
		{`[[[[`, "[0][0][0]: nesting deeper than 3 levels"},
		{`{"` + strings.Repeat("k", 100) + `":x}`, `["` + strings.Repeat("k", 64) + `..."]: invalid character 'x' at the start of a value`},
		{`{"a b":x}`, `["a b"]: invalid character 'x' at the start of a value`},
	}
	for _, tt := range tests {
		_, err := parseAll(tt.in, Limits{MaxDepth: 3})
		var e *Error
		if !errors.As(err, &e) || !e.Syntax {
			t.Errorf("%q: error %v is not a syntax *Error", tt.in, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("%q:\ngot  %s\nwant %s", tt.in, err.Error(), tt.want)
		}
	}
}

func TestLimits(t *testing.T) {
	_, err := parseAll(`[1,2,3]`, Limits{MaxBytes: 6})
	if err == nil || err.Error() != "document is 7 bytes, more than the limit of 6" {
		t.Errorf("MaxBytes: %v", err)
	}
	if _, err := parseAll(`[1,2,3]`, Limits{MaxBytes: 7}); err != nil {
		t.Errorf("at MaxBytes: %v", err)
	}
	if _, err := parseAll(strings.Repeat("[", DefaultMaxDepth)+strings.Repeat("]", DefaultMaxDepth), Limits{}); err != nil {
		t.Errorf("at default depth: %v", err)
	}
	if _, err := parseAll(strings.Repeat("[", DefaultMaxDepth+1)+strings.Repeat("]", DefaultMaxDepth+1), Limits{}); err == nil {
		t.Error("depth beyond default accepted")
	}
	// A hostile document cannot build an unbounded error list.
	doc := "[" + strings.Repeat(`"x",`, 1000) + `"x"]`
	d := NewDecoder([]byte(doc), Limits{})
	_ = d.Array(func(int) error { _, _ = d.Uint64(); return nil })
	_ = d.End()
	if n := len(d.Errors()); n != MaxErrors+1 || d.Errors()[n-1].Message != "too many errors" {
		t.Errorf("%d errors, last %v", n, d.Errors()[n-1])
	}
}

// TestValueErrorsContinue checks the pull API: value errors are collected with
// their paths and decoding goes on; unknown and unread members are reported.
func TestValueErrorsContinue(t *testing.T) {
	doc := `{"n":"x","s":1,"b":null,"list":[1,"two",3],"obj":{"deep":{"x":1}},"skip":[1,{"a":2}],"nul":null}`
	d := NewDecoder([]byte(doc), Limits{})
	var nums []uint64
	err := d.Object(func(key string) error {
		switch key {
		case "n":
			_, _ = d.Uint64()
		case "s":
			_, _ = d.String()
		case "b":
			_, _ = d.Bool()
		case "list":
			return d.Array(func(int) error {
				v, _ := d.Uint64()
				nums = append(nums, v)
				return nil
			})
		case "obj":
			return d.Object(func(string) error {
				if d.Path() != "obj.deep" {
					t.Errorf("Path() = %q", d.Path())
				}
				return d.UnknownField()
			})
		case "skip":
			return d.Skip()
		}
		return nil // "nul" not read: unknown field
	})
	if err != nil {
		t.Fatalf("Object: %v", err)
	}
	got := d.End()
	want := `n: must be a non-negative integer; s: must be a string; b: must be true or false; list[1]: must be a non-negative integer; obj.deep: unknown field; nul: unknown field`
	if got == nil || got.Error() != want {
		t.Errorf("errors:\ngot  %v\nwant %s", got, want)
	}
	var list ErrorList
	if !errors.As(got, &list) || len(list) != 6 || list[0].Offset != 5 {
		t.Errorf("ErrorList %#v", list)
	}
	if len(nums) != 3 || nums[2] != 3 {
		t.Errorf("nums %v", nums)
	}
}

func TestCallbackErrorStops(t *testing.T) {
	stop := errors.New("stop")
	d := NewDecoder([]byte(`[1,2,3]`), Limits{})
	calls := 0
	err := d.Array(func(int) error {
		calls++
		_, _ = d.Uint64()
		return stop
	})
	if err != stop || calls != 1 || d.End() != stop || d.Err() != stop {
		t.Errorf("err %v calls %d", err, calls)
	}
}

func TestFail(t *testing.T) {
	d := NewDecoder([]byte(`{"mode":"fast"}`), Limits{})
	_ = d.Object(func(string) error {
		if s, _ := d.String(); s != "slow" {
			d.Fail(`must be "slow"`)
		}
		return nil
	})
	if err := d.End(); err == nil || err.Error() != `mode: must be "slow"` {
		t.Errorf("got %v", err)
	}
}

func TestJoinPath(t *testing.T) {
	for _, tt := range [][3]string{
		{"rules[2]", "window", "rules[2].window"},
		{"rules", "[2]", "rules[2]"},
		{"", "id", "id"},
		{"rule", "", "rule"},
	} {
		if got := JoinPath(tt[0], tt[1]); got != tt[2] {
			t.Errorf("JoinPath(%q, %q) = %q", tt[0], tt[1], got)
		}
	}
}

func TestWriter(t *testing.T) {
	w := NewWriter(nil)
	w.BeginObject()
	w.AppendKey("a")
	w.AppendUint(1)
	w.AppendKey("b")
	w.BeginArray()
	w.AppendInt(-2)
	w.AppendBool(false)
	w.AppendNull()
	w.AppendDuration(90 * time.Second)
	w.BeginObject()
	w.EndObject()
	w.EndArray()
	w.AppendKey("c\n")
	w.AppendString("\"x\"")
	w.EndObject()
	const want = `{"a":1,"b":[-2,false,null,"1m30s",{}],"c\n":"\"x\""}`
	if got := string(w.Bytes()); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func BenchmarkDecode(b *testing.B) {
	doc := []byte(`{"policy":"default","version":7,"rules":[` + strings.Repeat(`{"id":"login-per-ip","description":"brute-force guard \u00e9","match":{"path_prefix":"/v1/auth/login","methods":["POST"]},"key":["client_ip"],"algorithm":"time_wheel","limit":10,"window":"5m","slots":30},`, 49) + `{}]}`)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseAll(string(doc), Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendString(b *testing.B) {
	s := strings.Repeat(`plain ascii text with a "quote" and é `, 4)
	buf := make([]byte, 0, 1024)
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendString(buf[:0], s)
	}
}

// TestPlainWordAgreesWithThePlainTable: plainWord says a word is plain
// exactly when the plain table says each of its bytes is, for every byte
// value at every position among plain neighbours and among the bytes that
// sit next to the tests' thresholds, and for a million random words.
func TestPlainWordAgreesWithThePlainTable(t *testing.T) {
	want := func(x uint64) bool {
		for k := 0; k < 8; k++ {
			if !plain[byte(x>>(8*k))] {
				return false
			}
		}
		return true
	}
	for _, fill := range []byte{'a', ' ', '!', '#', '[', ']', '~', 0x7f, 0x1f, '"', '\\', 0x80, 0xff, 0x00} {
		for pos := 0; pos < 8; pos++ {
			for b := 0; b < 256; b++ {
				var x uint64
				for k := 0; k < 8; k++ {
					c := fill
					if k == pos {
						c = byte(b)
					}
					x |= uint64(c) << (8 * k)
				}
				if plainWord(x) != want(x) {
					t.Fatalf("plainWord(%#016x) = %v, the table says %v", x, plainWord(x), want(x))
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1_000_000 {
		x := r.Uint64()
		if r.IntN(2) == 0 { // mostly printable ASCII, so that plain words occur
			x &= 0x3f3f3f3f3f3f3f3f
			x |= 0x4040404040404040 & r.Uint64()
			x |= 0x2020202020202020
		}
		if plainWord(x) != want(x) {
			t.Fatalf("plainWord(%#016x) = %v, the table says %v", x, plainWord(x), want(x))
		}
	}
}
