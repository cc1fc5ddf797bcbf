package strictjson

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecode checks that the decoder never panics, that everything it accepts is
// JSON by encoding/json's standard too (this decoder is stricter, never looser), and
// that accepted documents round-trip: decode, write canonically, decode again, write
// again gives the same bytes. Seeds: testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"policy":"default","version":7,"rules":[{"id":"a","limit":10,"window":"5m"}]}`,
		`[1,-0,2.5e-3,true,false,null,"\u00e9\ud83d\ude00\n"]`,
		`{"a":{"b":[[],{}]}}`,
		`"\u2028"`,
		`{"a":1,"a":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		lim := Limits{MaxBytes: 1 << 16, MaxDepth: 16}
		d := NewDecoder(doc, lim)
		v, _ := decodeValue(d)
		if err := d.End(); err != nil {
			if _, ok := err.(*Error); !ok {
				if _, ok := err.(ErrorList); !ok {
					t.Fatalf("error of type %T: %v", err, err)
				}
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("accepted a document encoding/json rejects: %q", doc)
		}
		var w Writer
		v.write(&w)
		first := append([]byte(nil), w.Bytes()...)
		d2 := NewDecoder(first, lim)
		v2, _ := decodeValue(d2)
		if err := d2.End(); err != nil {
			t.Fatalf("canonical output %q does not decode: %v", first, err)
		}
		var w2 Writer
		v2.write(&w2)
		if string(w2.Bytes()) != string(first) {
			t.Fatalf("not stable:\n%q\n%q", first, w2.Bytes())
		}
	})
}

// FuzzAppendString checks that AppendString writes one valid JSON string that
// reads back (encoding/json) as the input with every byte that is not part of
// valid UTF-8 replaced by U+FFFD, wherever the first byte needing an escape
// falls (the seeds put one at the start, inside and at the end).
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "rl:bench:default/per-user:user=alice:60s", `"`, `a"`, `ab\`, "\x00b",
		"ab\ncd", "tab\there", "\x7f", "é", "a\xffb", "\xe2\x80\xa8x", "end\u2029", `mixed "quotes" and \back\slashes`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString([]byte("prefix"), s)
		if !strings.HasPrefix(string(out), "prefix") {
			t.Fatalf("AppendString(%q) changed dst's bytes: %q", s, out)
		}
		out = out[len("prefix"):]
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("AppendString(%q) = %s: not one JSON string: %v", s, out, err)
		}
		var want strings.Builder
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			want.WriteRune(r) // RuneError for an invalid byte
			i += n
		}
		if got != want.String() {
			t.Fatalf("AppendString(%q) = %s, reads back as %q, want %q", s, out, got, want.String())
		}
	})
}
