// Package fleet is the filter's half of fleet-scoped rules: the bounded table of
// quota leases an Envoy holds, kept in proxy-wasm shared data so that every
// worker spends from the same lease by compare-and-swap. It is pure (no
// hostcalls): the plugin reads a bucket's bytes, edits them with this package
// and writes them back with the cas it read.
//
// # Layout
//
// A fleet rule has a fixed number of lease buckets (the plugin uses
// buckets_per_rule), each holding at most a fixed number of entries (the
// plugin uses entries_per_bucket). A bucket's value is its entries back to
// back, EntrySize bytes each, little-endian:
//
//	hash u64 | held u64 | used u64 | expiry i64 | sent i64 | fingerprint u64 | last_use i64 | claim i64 | charge u64 | charge_until i64 | reported i64 | left u64 | left_until i64
//
// A value whose length is not a multiple of EntrySize is corrupt and read as
// empty. An entry is found by the key's hash (the same SipHash the counter
// tables use); a full bucket evicts an entry that holds and owes nothing first
// (its lease ended, no charge due), else the one holding and owing the fewest
// units.
package fleet

import "encoding/binary"

// An encoded Entry, field by field, each 8 bytes little-endian; offsets and
// EntrySize follow from the list.
const (
	offHash = iota * 8
	offHeld
	offUsed
	offExpiry
	offSent
	offFingerprint
	offLastUse
	offClaim
	offCharge
	offChargeUntil
	offReported
	offLeft
	offLeftUntil
	offEnd
)

// EntrySize is the encoded size of an Entry in bytes (104).
const EntrySize = offEnd

// Layout names what the fields of an encoded Entry mean beyond their size: "c",
// slots 9 and 10 are a charge (Charge, ChargeUntil). The earlier layout of the
// same size held a debt there, paid from grants by the module itself. The
// plugin's lease keys hold EntrySize and Layout, so a module of another
// layout never reads these entries.
const Layout = "c"

// Entry is the lease an Envoy holds for one counter key of a fleet rule.
type Entry struct {
	// Hash is the counter key's hash.
	Hash uint64
	// Held is the units of the lease not spent yet.
	Held uint64
	// Used is the units spent since the last report to the quota service.
	Used uint64
	// Expiry is when the lease ends, Unix ns: the send time of the quota request
	// that granted it plus the answer's expires_in_ns. Held units are void after.
	Expiry int64
	// Sent is the send time, Unix ns, of the answer that set Expiry; an answer to
	// an older request never extends it.
	Sent int64
	// Fingerprint is the rule fingerprint (rules.CompiledRule.Fingerprint) the lease
	// was granted under; an entry of another fingerprint is read as absent.
	Fingerprint uint64
	// LastUse is when a request last spent from the lease, Unix ns.
	LastUse int64
	// Claim is until when, Unix ns, one worker is asking the quota service for this
	// key on the Envoy's behalf; the others do not ask meanwhile.
	Claim int64
	// Charge is the units this Envoy admitted for the key without a lease
	// (on_quota_failure "local" or "pass", while the quota service could not be
	// asked), which the service has not counted yet. The next report takes them
	// (TakeCharge) and the service books them against the key's budget
	// (quota.KeyRequest.Charge), once, whichever Envoy admitted them.
	Charge uint64
	// ChargeUntil is when Charge lapses unreported, Unix ns: the end of the
	// fixed window the units were admitted in, or a window of the rule after the
	// first of them for the other algorithms (by then they no longer weigh in
	// the service's count, and booking them would take from a later window).
	ChargeUntil int64
	// Reported is when a worker last took Used out of the entry for a report,
	// Unix ns (0: never). Every worker of the Envoy spends from the entry and
	// reports what was used since any of them last did, so Used over the time
	// since Reported is the whole Envoy's rate, which no worker's own reports
	// show.
	Reported int64
	// Left is what the quota service last said this Envoy may admit for the
	// key by itself in the current fixed window, should it lose the service
	// (its share of what the window had left beyond every lease,
	// quota.KeyResult.Left), valid until LeftUntil, Unix ns (the window's end
	// as the answer gave it; 0: never said). A cut-off worker's local share
	// of the limit is at most Left.
	Left      uint64
	LeftUntil int64
}

// AddCharge adds units admitted without a lease to e's charge at now; until is
// when the charge lapses if this starts a new one (the previous one lapsed or
// was reported).
func (e *Entry) AddCharge(units uint64, now, until int64) {
	if e.Charge == 0 || now >= e.ChargeUntil {
		e.Charge, e.ChargeUntil = 0, until
	}
	e.Charge += min(units, ^uint64(0)-e.Charge)
}

// TakeCharge returns the charge due at now for a report and clears it (0
// once it has lapsed). A report the service did not record gives it back
// with AddCharge(units, now, until), until the ChargeUntil read before.
func (e *Entry) TakeCharge(now int64) (units uint64, until int64) {
	units, until = e.Charge, e.ChargeUntil
	e.Charge, e.ChargeUntil = 0, 0
	if now >= until {
		return 0, 0
	}
	return units, until
}

// stake is what evicting e at now would lose: the units it holds while its
// lease lives plus the charge it still owes the service (saturating).
func (e *Entry) stake(now int64) uint64 {
	var held, charge uint64
	if now < e.Expiry {
		held = e.Held
	}
	if now < e.ChargeUntil {
		charge = e.Charge
	}
	return held + min(charge, ^uint64(0)-held)
}

// Usable reports whether the lease holds at least cost units at now under
// fingerprint fp.
func (e *Entry) Usable(fp uint64, now int64, cost uint64) bool {
	return e.Fingerprint == fp && now < e.Expiry && e.Held >= cost
}

// Live returns the units held at now under fp (0 once expired or for another
// fingerprint).
func (e *Entry) Live(fp uint64, now int64) uint64 {
	if e.Fingerprint != fp || now >= e.Expiry {
		return 0
	}
	return e.Held
}

// Valid reports whether b is a well-formed bucket value.
func Valid(b []byte) bool { return len(b)%EntrySize == 0 }

// Find returns the entry of hash in bucket value b and its index, or false
// (also for a corrupt value).
func Find(b []byte, hash uint64) (Entry, int, bool) {
	if !Valid(b) {
		return Entry{}, -1, false
	}
	for i := 0; i+EntrySize <= len(b); i += EntrySize {
		if binary.LittleEndian.Uint64(b[i+offHash:]) == hash {
			return decode(b[i:]), i / EntrySize, true
		}
	}
	return Entry{}, -1, false
}

// Put appends to dst the bucket value b with e stored: in place of the entry of
// e.Hash if there is one, else appended if the bucket holds fewer than max
// entries, else over an entry that holds and owes nothing at now (its lease
// ended, no charge due) or, failing that, the one holding and owing the fewest
// units (stake). A corrupt b is replaced by e alone. It reports whether an
// entry was evicted.
func Put(dst, b []byte, e Entry, max int, now int64) ([]byte, bool) {
	if !Valid(b) {
		b = nil
	}
	n := len(b) / EntrySize
	idx, evicted := -1, false
	for i := 0; i < n; i++ {
		if binary.LittleEndian.Uint64(b[i*EntrySize+offHash:]) == e.Hash {
			idx = i
			break
		}
	}
	if idx < 0 && n >= max && n > 0 {
		evicted = true
		var least uint64
		for i := 0; i < n; i++ {
			o := decode(b[i*EntrySize:])
			stake := o.stake(now)
			if stake == 0 {
				idx = i
				break
			}
			if idx < 0 || stake < least {
				idx, least = i, stake
			}
		}
	}
	base := len(dst)
	dst = append(dst, b...)
	if idx < 0 {
		var zero [EntrySize]byte
		dst = append(dst, zero[:]...)
		idx = n
	}
	encode(dst[base+idx*EntrySize:], e)
	return dst, evicted
}

// Entries returns every entry of bucket value b (none for a corrupt value).
func Entries(b []byte) []Entry {
	if !Valid(b) {
		return nil
	}
	out := make([]Entry, 0, len(b)/EntrySize)
	for i := 0; i+EntrySize <= len(b); i += EntrySize {
		out = append(out, decode(b[i:]))
	}
	return out
}

func decode(b []byte) Entry {
	le := binary.LittleEndian
	return Entry{
		Hash: le.Uint64(b[offHash:]), Held: le.Uint64(b[offHeld:]), Used: le.Uint64(b[offUsed:]),
		Expiry: int64(le.Uint64(b[offExpiry:])), Sent: int64(le.Uint64(b[offSent:])),
		Fingerprint: le.Uint64(b[offFingerprint:]), LastUse: int64(le.Uint64(b[offLastUse:])), Claim: int64(le.Uint64(b[offClaim:])),
		Charge: le.Uint64(b[offCharge:]), ChargeUntil: int64(le.Uint64(b[offChargeUntil:])),
		Reported: int64(le.Uint64(b[offReported:])),
		Left:     le.Uint64(b[offLeft:]), LeftUntil: int64(le.Uint64(b[offLeftUntil:])),
	}
}

func encode(b []byte, e Entry) {
	if len(b) < EntrySize {
		return
	}
	le := binary.LittleEndian
	le.PutUint64(b[offHash:], e.Hash)
	le.PutUint64(b[offHeld:], e.Held)
	le.PutUint64(b[offUsed:], e.Used)
	le.PutUint64(b[offExpiry:], uint64(e.Expiry))
	le.PutUint64(b[offSent:], uint64(e.Sent))
	le.PutUint64(b[offFingerprint:], e.Fingerprint)
	le.PutUint64(b[offLastUse:], uint64(e.LastUse))
	le.PutUint64(b[offClaim:], uint64(e.Claim))
	le.PutUint64(b[offCharge:], e.Charge)
	le.PutUint64(b[offChargeUntil:], uint64(e.ChargeUntil))
	le.PutUint64(b[offReported:], uint64(e.Reported))
	le.PutUint64(b[offLeft:], e.Left)
	le.PutUint64(b[offLeftUntil:], uint64(e.LeftUntil))
}
