// Package siphash is SipHash-2-4, the keyed 64-bit hash of Aumasson and Bernstein
// ("SipHash: a fast short-input PRF", INDOCRYPT 2012, https://131002.net/siphash/),
// for hashing rate-limit keys to shared-data buckets.
//
// sluice needs every worker VM of one Envoy to map a client key to the same bucket
// (so the hash must be deterministic, unlike hash/maphash, whose seed is per process)
// while a client must not be able to choose keys that all land in one bucket (so the
// hash must be keyed with a secret: SipHash is a PRF under its 128-bit key). The filter
// generates the Key once per Envoy and stores it in shared data; all VMs read it.
//
// It follows the reference implementation exactly (c = 2 compression rounds per 8-byte
// word, d = 4 finalization rounds, key words little-endian, message length mod 256 in
// the top byte of the last word) and is checked against its 64 test vectors. Nothing
// here allocates; a string is hashed without converting it to []byte.
package siphash

import (
	"encoding/binary"
	"math/bits"
)

// Size is the length in bytes of a Key.
const Size = 16

// Key is a 128-bit SipHash key: k0 is bytes 0..7 and k1 bytes 8..15, little-endian,
// as in the reference implementation.
type Key [Size]byte

// KeyFromBytes returns the Key held in b, and false unless len(b) == Size.
func KeyFromBytes(b []byte) (Key, bool) {
	var k Key
	if len(b) != Size {
		return k, false
	}
	copy(k[:], b)
	return k, true
}

func (k Key) words() (k0, k1 uint64) {
	return binary.LittleEndian.Uint64(k[0:8]), binary.LittleEndian.Uint64(k[8:16])
}

// Sum64 returns SipHash-2-4 of data under k, without allocating. (The key
// travels as two words: a pointer to it through the generic sum made the
// compiler move every caller's key to the heap.)
func Sum64(k Key, data []byte) uint64 {
	k0, k1 := k.words()
	return sum(k0, k1, data)
}

// Sum64String returns SipHash-2-4 of the bytes of s under k, without allocating.
func Sum64String(k Key, s string) uint64 {
	k0, k1 := k.words()
	return sum(k0, k1, s)
}

type state struct{ v0, v1, v2, v3 uint64 }

func newState(k0, k1 uint64) state {
	return state{
		v0: k0 ^ 0x736f6d6570736575, // "somepseu"
		v1: k1 ^ 0x646f72616e646f6d, // "dorandom"
		v2: k0 ^ 0x6c7967656e657261, // "lygenera"
		v3: k1 ^ 0x7465646279746573, // "tedbytes"
	}
}

// round is one SipRound, on values so that it inlines and v0..v3 stay in registers.
func round(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13) ^ v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16) ^ v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21) ^ v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17) ^ v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// compress absorbs one message word (c = 2 rounds).
func (s *state) compress(m uint64) {
	v0, v1, v2, v3 := s.v0, s.v1, s.v2, s.v3^m
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	s.v0, s.v1, s.v2, s.v3 = v0^m, v1, v2, v3
}

// finish absorbs the last word b and runs d = 4 finalization rounds.
func (s *state) finish(b uint64) uint64 {
	s.compress(b)
	v0, v1, v2, v3 := s.v0, s.v1, s.v2^0xff, s.v3
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

func le64[T string | []byte](p T) uint64 {
	_ = p[7]
	return uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 |
		uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
}

func sum[T string | []byte](k0, k1 uint64, p T) uint64 {
	st := newState(k0, k1)
	v0, v1, v2, v3 := st.v0, st.v1, st.v2, st.v3
	n := len(p)
	for len(p) >= 8 {
		m := le64(p)
		v3 ^= m
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
		v0 ^= m
		p = p[8:]
	}
	b := uint64(n) << 56
	for i := len(p) - 1; i >= 0; i-- {
		b |= uint64(p[i]) << (8 * i)
	}
	st = state{v0, v1, v2, v3}
	return st.finish(b)
}

// Digest hashes a message given in pieces (for a rate-limit key built from several
// parts) without allocating: declare it as a value, Write the parts, call Sum64. The
// result equals Sum64 of the concatenated parts. The zero Digest is not usable; use
// New.
type Digest struct {
	s   state
	buf [8]byte
	nb  int    // bytes in buf
	n   uint64 // bytes written
}

// New returns a Digest keyed with k.
func New(k Key) Digest {
	k0, k1 := k.words()
	return Digest{s: newState(k0, k1)}
}

// Write absorbs p. It never fails; the results are for io.Writer compatibility.
func (d *Digest) Write(p []byte) (int, error) { write(d, p); return len(p), nil }

// WriteString absorbs the bytes of s without allocating.
func (d *Digest) WriteString(s string) (int, error) { write(d, s); return len(s), nil }

// WriteByte absorbs one byte.
func (d *Digest) WriteByte(c byte) error {
	d.n++
	d.buf[d.nb] = c
	d.nb++
	if d.nb == 8 {
		d.s.compress(le64(d.buf[:]))
		d.nb = 0
	}
	return nil
}

func write[T string | []byte](d *Digest, p T) {
	d.n += uint64(len(p))
	if d.nb > 0 {
		c := copy(d.buf[d.nb:], p)
		d.nb += c
		p = p[c:]
		if d.nb < 8 {
			return
		}
		d.s.compress(le64(d.buf[:]))
		d.nb = 0
	}
	for len(p) >= 8 {
		d.s.compress(le64(p))
		p = p[8:]
	}
	d.nb = copy(d.buf[:], p)
}

// Sum64 returns the hash of everything written so far; d is unchanged and may be
// written to further.
func (d *Digest) Sum64() uint64 {
	s := d.s
	b := d.n << 56
	for i := d.nb - 1; i >= 0; i-- {
		b |= uint64(d.buf[i]) << (8 * i)
	}
	return s.finish(b)
}
