package quota

import (
	"encoding/binary"
	"errors"
)

// value is what the backend stores under one counter key: the global limiter state
// and the ledger of leases, one entry per Envoy that asked recently.
//
// Encoding (little-endian), format 1:
//
//	[0]        1 (format)
//	[1:3]      n, uint16: state length
//	[3:3+n]    limiter state (limit.Limiter bytes)
//	u64        total: units ever granted under this value (wrapping counter)
//	u16        m: ledger entries, then m times:
//	  u8 len, id bytes   Envoy id
//	  u64 held           units granted and not returned
//	  i64 exp            Unix ns the lease ends (service clock); 0 = none
//	  u64 tag            window end (fixed_window) or slot (time_wheel) of the lease
//	  i64 last           Unix ns of the Envoy's last report for this key
//	  u64 seq            total just after the lease's first grant (token_bucket, gcra)
//	  u64 first          token_bucket, gcra: units of that first grant not yet
//	                     credited back; fixed_window, time_wheel: units granted
//	                     under tag (fleetLimiter.share)
//
// Only this code writes these values, under a key that names the rule's
// fingerprint (so the state size always matches); a value that does not decode
// anyway reads as a fresh key with no leases.
type value struct {
	state   []byte
	total   uint64
	entries []entry
}

type entry struct {
	envoy string
	held  uint64
	exp   int64
	tag   uint64
	last  int64
	seq   uint64
	first uint64
}

const formatV1 = 1

var errFormat = errors.New("quota: stored value does not decode")

func decodeValue(b []byte, stateSize int) (value, error) {
	var v value
	if len(b) == 0 {
		return v, nil
	}
	if len(b) < 5 || b[0] != formatV1 {
		return value{}, errFormat
	}
	n := int(binary.LittleEndian.Uint16(b[1:3]))
	if len(b) < 3+n+10 || n != stateSize {
		return value{}, errFormat
	}
	v.state = b[3 : 3+n]
	p := 3 + n
	v.total = binary.LittleEndian.Uint64(b[p:])
	p += 8
	m := int(binary.LittleEndian.Uint16(b[p:]))
	p += 2
	v.entries = make([]entry, 0, m+1)
	for i := 0; i < m; i++ {
		if p >= len(b) {
			return value{}, errFormat
		}
		l := int(b[p])
		p++
		if p+l+48 > len(b) {
			return value{}, errFormat
		}
		e := entry{envoy: string(b[p : p+l])}
		p += l
		e.held = binary.LittleEndian.Uint64(b[p:])
		e.exp = int64(binary.LittleEndian.Uint64(b[p+8:]))
		e.tag = binary.LittleEndian.Uint64(b[p+16:])
		e.last = int64(binary.LittleEndian.Uint64(b[p+24:]))
		e.seq = binary.LittleEndian.Uint64(b[p+32:])
		e.first = binary.LittleEndian.Uint64(b[p+40:])
		p += 48
		v.entries = append(v.entries, e)
	}
	if p != len(b) {
		return value{}, errFormat
	}
	return v, nil
}

func (v *value) encode(dst []byte) []byte {
	dst = append(dst, formatV1)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(v.state)))
	dst = append(dst, v.state...)
	dst = binary.LittleEndian.AppendUint64(dst, v.total)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(v.entries)))
	for _, e := range v.entries {
		dst = append(dst, byte(len(e.envoy)))
		dst = append(dst, e.envoy...)
		dst = binary.LittleEndian.AppendUint64(dst, e.held)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.exp))
		dst = binary.LittleEndian.AppendUint64(dst, e.tag)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.last))
		dst = binary.LittleEndian.AppendUint64(dst, e.seq)
		dst = binary.LittleEndian.AppendUint64(dst, e.first)
	}
	return dst
}

// TokenOwner is the ledger prefix of every caller the quota token alone
// authenticates (IdentityBody): an entry is named TokenOwner then the request's
// "envoy" field. No certificate identity's prefix (Owner: 16 characters, then '/')
// can begin like it, so a token caller can never name, return or read a
// certificate identity's entry, even on a replica sharing its Redis.
const TokenOwner = "t/"

// EntryName returns the ledger entry name of Envoy id under owner (Owner of an
// identity, or "" for a caller the token alone authenticates).
func EntryName(owner, id string) string {
	if owner == "" {
		return TokenOwner + id
	}
	return owner + id
}

// makeRoom keeps one identity from filling a key's ledger. When the entry name
// (owner then the Envoy's id) is not in v and owner already has maxN entries, it
// removes the owner's entry that can best give way (giveWay) and reports evicted;
// when none can, it removes nothing and reports full: the newcomer is answered
// retry, and no lease in use is touched. owner "" (no identity) is never limited.
func makeRoom(v *value, name, owner string, maxN int, now, retain int64) (evicted, full bool) {
	if owner == "" || maxN <= 0 {
		return false, false
	}
	n, best := 0, -1
	for i := range v.entries {
		e := &v.entries[i]
		if e.envoy == name {
			return false, false
		}
		if len(e.envoy) >= len(owner) && e.envoy[:len(owner)] == owner {
			n++
			if giveWay(e, now, retain) > 0 && (best < 0 || better(e, &v.entries[best], now, retain)) {
				best = i
			}
		}
	}
	switch {
	case n < maxN:
		return false, false
	case best < 0:
		return false, true
	}
	v.entries = append(v.entries[:best], v.entries[best+1:]...)
	return true, false
}

// giveWay ranks how readily an entry gives its place to a newcomer at now, with
// retain the time an Envoy counts as active after its last report:
//
//	2  it holds no live lease: nothing of it can be spent, removing it changes no count
//	1  its lease is live but its Envoy stopped reporting (a pod gone in a rollout,
//	   made-up ids that asked once): the units stay counted in the limiter state,
//	   never credited back, so removing it cannot let the fleet admit more; the
//	   filter never carries such units into a newer lease (it replaces a lease whose
//	   answer says the service holds nothing else)
//	0  a live lease of an Envoy that reports: never removed
func giveWay(e *entry, now, retain int64) int {
	switch {
	case e.held == 0 || e.exp <= now:
		return 2
	case e.last+retain <= now:
		return 1
	}
	return 0
}

// better reports whether a gives way before b: higher rank, then less recent.
func better(a, b *entry, now, retain int64) bool {
	ra, rb := giveWay(a, now, retain), giveWay(b, now, retain)
	return ra > rb || ra == rb && a.last < b.last
}

// dropIdle removes the entry of v that best gives way (giveWay) and reports
// whether there was one.
func dropIdle(v *value, now, retain int64) bool {
	best := -1
	for i := range v.entries {
		if e := &v.entries[i]; giveWay(e, now, retain) > 0 && (best < 0 || better(e, &v.entries[best], now, retain)) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	v.entries = append(v.entries[:best], v.entries[best+1:]...)
	return true
}
