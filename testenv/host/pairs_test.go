package host

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
)

// The host's codec and the guest's are written apart on purpose; these tests hold
// them to one wire format, each reading what the other writes.

var pairsCases = [][][2]string{
	nil,
	{{"", ""}},
	{{":method", "GET"}, {":path", "/a?b=c"}, {"x-user-id", "alice"}},
	{{"k", "v\x00with-nul"}, {"repeated", "1"}, {"repeated", "2"}},
}

func TestPairsCodecsAgree(t *testing.T) {
	for _, m := range pairsCases {
		host := encodePairs(m)
		if guest := pairs.Encode(m); string(guest) != string(host) && len(m) > 0 {
			t.Errorf("%q: host encodes %x, guest %x", m, host, guest)
		}
		got, err := pairs.Decode(host)
		if err != nil || len(got) != len(m) {
			t.Fatalf("%q: guest reads the host's bytes as %q, %v", m, got, err)
		}
		back, ok := decodePairs(pairs.Encode(m))
		if !ok || len(back) != len(m) {
			t.Fatalf("%q: host reads the guest's bytes as %q, %v", m, back, ok)
		}
		for i := range m {
			if got[i] != m[i] || back[i] != m[i] {
				t.Errorf("%q: pair %d = %q (guest) / %q (host)", m, i, got[i], back[i])
			}
		}
	}
}

func TestPairsDecodeRefusesWhatCPPHostRefuses(t *testing.T) {
	good := encodePairs([][2]string{{"a", "b"}})
	for name, b := range map[string][]byte{
		"count only":      {1, 0, 0, 0},
		"short":           {1, 0},
		"missing nul":     append(good[:len(good)-1:len(good)-1], 'x'),
		"trailing":        append(append([]byte(nil), good...), 0),
		"too many pairs":  {0x01, 0x04, 0, 0},
		"length overflow": {1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0},
		"too large":       make([]byte, pairsMaxBytes+1),
	} {
		if m, ok := decodePairs(b); ok {
			t.Errorf("%s: decoded as %q, want refused", name, m)
		}
	}
}

func FuzzPairsDecode(f *testing.F) {
	for _, m := range pairsCases {
		f.Add(encodePairs(m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, ok := decodePairs(b) // must not panic
		_, err := pairs.Decode(b)
		if ok != (err == nil) {
			t.Fatalf("%x: host ok=%v, guest err=%v", b, ok, err)
		}
		if ok && len(m) > 0 && string(encodePairs(m)) != string(b) {
			t.Fatalf("%x: re-encodes as %x", b, encodePairs(m))
		}
	})
}
