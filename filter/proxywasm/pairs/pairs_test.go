package pairs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// raw builds an input from little-endian u32 values and byte strings.
func raw(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch v := p.(type) {
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case int:
			b = binary.LittleEndian.AppendUint32(b, uint32(v))
		case string:
			b = append(b, v...)
		default:
			panic("raw: unsupported part")
		}
	}
	return b
}

// specExample is the map {"a": "1", "b": "22"} written out byte by byte, in
// the layout of the spec's "Serialization" section.
var specExample = []byte{
	2, 0, 0, 0, // N=2
	1, 0, 0, 0, 1, 0, 0, 0, // "a", "1"
	1, 0, 0, 0, 2, 0, 0, 0, // "b", "22"
	'a', 0, '1', 0,
	'b', 0, '2', '2', 0,
}

func TestEncode(t *testing.T) {
	tests := []struct {
		name  string
		pairs [][2]string
		want  []byte
	}{
		{name: "nil", pairs: nil, want: []byte{0, 0, 0, 0}},
		{name: "empty", pairs: [][2]string{}, want: []byte{0, 0, 0, 0}},
		{name: "two pairs", pairs: [][2]string{{"a", "1"}, {"b", "22"}}, want: specExample},
		{
			name:  "empty key and value",
			pairs: [][2]string{{"", ""}},
			want:  []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		},
		{
			name:  "pseudo header",
			pairs: [][2]string{{":path", "/x"}},
			want:  raw(1, 5, 2, ":path\x00/x\x00"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Encode(tc.pairs)
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tc.pairs, got, tc.want)
			}
			if len(got) != Size(tc.pairs) {
				t.Fatalf("Size = %d, want %d", Size(tc.pairs), len(got))
			}
		})
	}
}

func TestAppendEncodeKeepsPrefixAndReusesCapacity(t *testing.T) {
	dst := make([]byte, 3, 64)
	copy(dst, "xyz")
	got := AppendEncode(dst, [][2]string{{"a", "1"}, {"b", "22"}})
	if want := append([]byte("xyz"), specExample...); !bytes.Equal(got, want) {
		t.Fatalf("AppendEncode = %v, want %v", got, want)
	}
	if &got[0] != &dst[0] {
		t.Fatal("AppendEncode reallocated although dst had capacity")
	}
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want [][2]string
	}{
		{name: "size 0", in: nil, want: nil},
		{name: "size 1", in: []byte{0}, want: nil},
		{name: "size 1 nonzero", in: []byte{7}, want: nil},
		{name: "count 0", in: raw(0), want: nil},
		{name: "two pairs", in: specExample, want: [][2]string{{"a", "1"}, {"b", "22"}}},
		{name: "empty key and value", in: raw(1, 0, 0, "\x00\x00"), want: [][2]string{{"", ""}}},
		{name: "repeated key kept in order", in: raw(2, 1, 1, 1, 1, "k\x00a\x00k\x00b\x00"), want: [][2]string{{"k", "a"}, {"k", "b"}}},
		{name: "binary value", in: raw(1, 1, 2, "k\x00\xff\x01\x00"), want: [][2]string{{"k", "\xff\x01"}}},
		{name: "max count", in: Encode(make([][2]string, MaxCount)), want: make([][2]string, MaxCount)},
		{
			name: "exactly max bytes",
			in:   raw(1, 3, MaxBytes-4-8-3-2, "key\x00", strings.Repeat("v", MaxBytes-4-8-3-2), "\x00"),
			want: [][2]string{{"key", strings.Repeat("v", MaxBytes-4-8-3-2)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decode = %q, want %q", got, tc.want)
			}
			got2, err := DecodeString(string(tc.in))
			if err != nil || !reflect.DeepEqual(got2, tc.want) {
				t.Fatalf("DecodeString = %q, %v; want %q", got2, err, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name       string
		in         []byte
		wantErr    error
		wantOffset int
	}{
		{name: "two bytes", in: []byte{1, 0}, wantErr: ErrTruncated, wantOffset: 2},
		{name: "three bytes", in: []byte{1, 0, 0}, wantErr: ErrTruncated, wantOffset: 3},
		{name: "count without table", in: raw(1), wantErr: ErrTruncated, wantOffset: 4},
		{name: "half a table entry", in: raw(1, 1), wantErr: ErrTruncated, wantOffset: 8},
		{name: "count larger than table", in: raw(2, 1, 1, "a\x00b\x00"), wantErr: ErrTruncated, wantOffset: 16},
		{name: "key cut short", in: raw(1, 3, 1, "ab"), wantErr: ErrTruncated, wantOffset: 14},
		{name: "key without NUL at end of input", in: raw(1, 1, 1, "a"), wantErr: ErrTruncated, wantOffset: 13},
		{name: "value cut short", in: raw(1, 1, 3, "a\x00b"), wantErr: ErrTruncated, wantOffset: 15},
		{name: "value without NUL at end", in: raw(1, 1, 1, "a\x00b"), wantErr: ErrTruncated, wantOffset: 15},
		{name: "key NUL missing", in: raw(1, 1, 1, "ab1\x00"), wantErr: ErrMissingNUL, wantOffset: 13},
		{name: "value NUL missing", in: raw(1, 1, 1, "a\x001x"), wantErr: ErrMissingNUL, wantOffset: 15},
		{name: "count smaller than data", in: raw(1, 1, 1, "a\x001\x00b\x002\x00"), wantErr: ErrTrailingData, wantOffset: 16},
		{name: "count 0 with data", in: raw(0, "x"), wantErr: ErrTrailingData, wantOffset: 4},
		{name: "key length 0xFFFFFFFF", in: raw(1, uint32(0xFFFFFFFF), 0, "a\x00\x00"), wantErr: ErrLengthOverflow, wantOffset: 12},
		{name: "value length 0x80000000", in: raw(1, 1, uint32(0x80000000), "a\x00b\x00"), wantErr: ErrLengthOverflow, wantOffset: 14},
		{name: "length MaxBytes", in: raw(1, MaxBytes, 0, "a\x00\x00"), wantErr: ErrLengthOverflow, wantOffset: 12},
		{name: "count 1025", in: raw(MaxCount + 1), wantErr: ErrTooManyPairs, wantOffset: 0},
		{name: "count 0xFFFFFFFF", in: raw(uint32(0xFFFFFFFF), 0, 0), wantErr: ErrTooManyPairs, wantOffset: 0},
		{name: "one byte over max bytes", in: make([]byte, MaxBytes+1), wantErr: ErrTooLarge, wantOffset: MaxBytes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, dec := range []struct {
				name string
				fn   func([]byte) ([][2]string, error)
			}{
				{"Decode", Decode},
				{"DecodeString", func(b []byte) ([][2]string, error) { return DecodeString(string(b)) }},
			} {
				got, err := dec.fn(tc.in)
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("%s error = %v, want %v", dec.name, err, tc.wantErr)
				}
				if got != nil {
					t.Fatalf("%s returned pairs %q with error", dec.name, got)
				}
				var de *DecodeError
				if !errors.As(err, &de) || de.Offset != tc.wantOffset {
					t.Fatalf("%s error %v: offset want %d", dec.name, err, tc.wantOffset)
				}
			}
		})
	}
}

func TestDecodeErrorsAreDistinct(t *testing.T) {
	all := []error{ErrTooLarge, ErrTooManyPairs, ErrTruncated, ErrLengthOverflow, ErrMissingNUL, ErrTrailingData}
	for i, a := range all {
		for j, b := range all {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v matches %v", a, b)
			}
		}
	}
}

func TestDecodeErrorMessage(t *testing.T) {
	_, err := Decode(raw(1, 1, 1, "ab1\x00"))
	if got, want := err.Error(), "pairs: missing NUL terminator (at byte 13)"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestDecodeCopiesInput(t *testing.T) {
	in := Encode([][2]string{{"k", "v"}})
	got, err := Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		in[i] = 'X'
	}
	if got[0] != [2]string{"k", "v"} {
		t.Fatalf("Decode result changed with its input: %q", got)
	}
}

func TestRoundTrip(t *testing.T) {
	cases := [][][2]string{
		{{":method", "GET"}, {":path", "/v1/x?y=1"}, {":authority", "example.com"}, {"x-api-key", "abc"}},
		{{"", ""}, {"k", ""}, {"", "v"}},
		{{"bin", "\x00\x01\xff"}},
		{{strings.Repeat("k", 4096), strings.Repeat("v", 65536)}},
	}
	for _, want := range cases {
		got, err := Decode(Encode(want))
		if err != nil {
			t.Fatalf("Decode(Encode(%.40q)): %v", want, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip = %.40q, want %.40q", got, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add(specExample)
	f.Add(raw(1, 1, 1, "ab1\x00"))
	f.Add(raw(1, uint32(0xFFFFFFFF), 0, "a\x00\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := Decode(in)
		if err != nil {
			if got != nil {
				t.Fatalf("pairs returned with error %v", err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			return
		}
		if len(got) > MaxCount {
			t.Fatalf("%d pairs > MaxCount", len(got))
		}
		// Anything accepted re-encodes to the same bytes, except the
		// one-byte and count-0 forms of the empty map.
		if len(got) == 0 {
			if len(in) > 1 && !bytes.Equal(in, []byte{0, 0, 0, 0}) {
				t.Fatalf("empty map decoded from %v", in)
			}
			return
		}
		if re := Encode(got); !bytes.Equal(re, in) {
			t.Fatalf("Encode(Decode(%v)) = %v", in, re)
		}
		got2, err := DecodeString(string(in))
		if err != nil || !reflect.DeepEqual(got, got2) {
			t.Fatalf("DecodeString disagrees: %q, %v", got2, err)
		}
	})
}

func BenchmarkDecodeString(b *testing.B) {
	s := string(Encode([][2]string{{":method", "GET"}, {":path", "/v1/x"}, {":authority", "example.com"}, {"user-agent", "curl/8"}, {"x-api-key", "abc"}}))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeString(s); err != nil {
			b.Fatal(err)
		}
	}
}
