package limit

import "math/bits"

// Unsigned 128-bit helpers over (hi, lo) pairs, so the algorithms stay exact in
// integers. None of them panics.

func mul64(a, b uint64) (hi, lo uint64) { return bits.Mul64(a, b) }

func add128(ahi, alo, bhi, blo uint64) (hi, lo uint64) {
	lo, c := bits.Add64(alo, blo, 0)
	hi, _ = bits.Add64(ahi, bhi, c)
	return hi, lo
}

// sub128 returns a-b, or 0 if b > a (saturating).
func sub128(ahi, alo, bhi, blo uint64) (hi, lo uint64) {
	if cmp128(ahi, alo, bhi, blo) <= 0 {
		return 0, 0
	}
	lo, b := bits.Sub64(alo, blo, 0)
	hi, _ = bits.Sub64(ahi, bhi, b)
	return hi, lo
}

func cmp128(ahi, alo, bhi, blo uint64) int {
	switch {
	case ahi < bhi:
		return -1
	case ahi > bhi:
		return 1
	case alo < blo:
		return -1
	case alo > blo:
		return 1
	}
	return 0
}

// div128 returns floor((hi,lo)/d) and the remainder, saturating the quotient at
// MaxUint64 when it does not fit; d must be > 0 (d == 0 returns MaxUint64, 0).
func div128(hi, lo, d uint64) (q, r uint64) {
	if d == 0 || hi >= d {
		return 1<<64 - 1, 0
	}
	if hi == 0 {
		// The common case (a debt below 2^64 ticks): one native 64-bit
		// division, where bits.Div64 is a long division in Go code under
		// wasm.
		return lo / d, lo % d
	}
	return bits.Div64(hi, lo, d)
}

// ceilDiv128 returns ceil((hi,lo)/d), saturating like div128.
func ceilDiv128(hi, lo, d uint64) uint64 {
	q, r := div128(hi, lo, d)
	if r != 0 && q != 1<<64-1 {
		q++
	}
	return q
}
