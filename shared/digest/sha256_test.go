package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// The examples of FIPS 180-4's companion document (NIST, "SHA256.pdf").
func TestSum256KnownAnswers(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
		{strings.Repeat("a", 1000000), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
	} {
		got := Sum256(c.in)
		if hex.EncodeToString(got[:]) != c.want {
			t.Errorf("Sum256(%.20q…) = %x, want %s", c.in, got, c.want)
		}
	}
}

// TestSum256MatchesCryptoAtEveryPaddingLength covers each length around the block
// and padding boundaries.
func TestSum256MatchesCryptoAtEveryPaddingLength(t *testing.T) {
	b := make([]byte, 300)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	for n := 0; n <= len(b); n++ {
		if got, want := Sum256(b[:n]), sha256.Sum256(b[:n]); got != want {
			t.Fatalf("length %d: %x, want %x", n, got, want)
		}
	}
}

func FuzzSum256MatchesCrypto(f *testing.F) {
	f.Add([]byte("x-user-id"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Sum256(b), sha256.Sum256(b); got != want {
			t.Fatalf("%x: %x, want %x", b, got, want)
		}
	})
}

func BenchmarkSum256Of2KiB(b *testing.B) {
	v := strings.Repeat("u", 2048)
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		Sum256(v)
	}
}
