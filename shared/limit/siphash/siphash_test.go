package siphash

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// vectors are the reference implementation's vectors_sip64 (SipHash-2-4, 64-bit
// output): key 00 01 .. 0f, message 00 01 .. n-1 for n = 0..63. Entry 15 is the worked
// example of the paper's Appendix A.
var vectors = [64]uint64{
	0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
	0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
	0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
	0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
	0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
	0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
	0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
	0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
	0x7127512f72f27cce, 0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
	0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d, 0x9abfd8766a33735c,
	0x0e3ea96b5304a7d0, 0xad0c42d6fc585992, 0x187306c89bc215a9, 0xd4a60abcf3792b95,
	0xf935451de4f21df2, 0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
	0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72, 0xa192d576b245165a,
	0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f, 0x7fa8220ba3b2ecea, 0x245731c13ca42499,
	0xb78dbfaf3a8d83bd, 0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
	0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57, 0x958a324ceb064572,
}

func refKey() Key {
	var k Key
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

func TestVectors(t *testing.T) {
	k := refKey()
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for n, want := range vectors {
		if got := Sum64(k, msg[:n]); got != want {
			t.Errorf("Sum64(len %d) = %#016x, want %#016x", n, got, want)
		}
		if got := Sum64String(k, string(msg[:n])); got != want {
			t.Errorf("Sum64String(len %d) = %#016x, want %#016x", n, got, want)
		}
		// Every split into two Writes and one WriteByte gives the same hash.
		for cut := 0; cut <= n; cut++ {
			d := New(k)
			d.Write(msg[:cut])
			if cut < n {
				d.WriteByte(msg[cut])
				d.WriteString(string(msg[cut+1 : n]))
			}
			if got := d.Sum64(); got != want {
				t.Fatalf("Digest(len %d, cut %d) = %#016x, want %#016x", n, cut, got, want)
			}
		}
	}
}

func TestKeyMatters(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var a, b Key
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	b = a
	b[15] ^= 1
	if Sum64String(a, "client-1") == Sum64String(b, "client-1") {
		t.Error("one key bit changed nothing")
	}
	if _, ok := KeyFromBytes(make([]byte, 15)); ok {
		t.Error("KeyFromBytes accepted 15 bytes")
	}
	if k, ok := KeyFromBytes(a[:]); !ok || k != a {
		t.Error("KeyFromBytes round trip")
	}
}

func TestNoAllocs(t *testing.T) {
	k := refKey()
	s := "rl:prod:user:alice:60s"
	if n := testing.AllocsPerRun(100, func() {
		_ = Sum64String(k, s)
		d := New(k)
		d.WriteString("rl:")
		d.WriteString(s)
		_ = d.Sum64()
	}); n != 0 {
		t.Errorf("allocs = %v", n)
	}
}

func BenchmarkSum64String(b *testing.B) {
	k := refKey()
	for _, s := range []string{"203.0.113.7", "rl:prod:tenant:acme-corporation:user:alice@example.com:3600s"} {
		b.Run(strconv.Itoa(len(s))+"B", func(b *testing.B) {
			for b.Loop() {
				_ = Sum64String(k, s)
			}
		})
	}
}
