package quota

import (
	"encoding/binary"
	"errors"
	"time"
)

// A counter key's quota state is split so that a round reads and writes what its
// askers touch, never the whole fleet (docs/RATIONALE.md, "One key, thousands of
// Envoys"). The backend stores it as a hash of fields under the key:
//
//	"h"            the header: the limiter state and the ledger's aggregates
//	"e:" + name    one ledger entry per Envoy (or RLQS stream) that asked recently
//	"o:" + owner   how many entries an identity holds on the key
//
// Every write of a round is one compare-and-swap on the header that sets the
// changed entries and owner counts with it, so a header that did not change
// means no entry changed either.
const (
	headerField = "h"
	entryPrefix = "e:"
	ownerPrefix = "o:"
)

// header is the "h" field of a key.
//
// Encoding (little-endian), format 2:
//
//	[0]        2 (format)
//	[1:3]      n, uint16: state length
//	[3:3+n]    limiter state (limit.Limiter bytes)
//	headerFixed  the aggregates, in its field order (headerFixedSize bytes)
//	k times ringSlotFields, k = headerFixed.Slots: the activity ring's non-zero slots
//
// Only this code writes these values, under a key that names the rule's
// fingerprint (so the state size always matches). A header that is absent is a
// fresh key; one that is present and does not decode fails the round (load).
type header struct {
	state   []byte
	total   uint64
	latest  int64
	maxExp  int64
	writes  uint64
	count   uint32
	heldSum uint64
	winTag  uint64
	// grantedA is Σ granted of the assignment entries (RLQS streams) in winTag.
	grantedA uint64
	ring     activity
}

// headerFixed is the header's encoding after the limiter state and before the
// ring's slots, field by field; its size and offsets come from this list alone
// (binary.Size, binary.Append, binary.Decode).
type headerFixed struct {
	Total   uint64 // units ever granted under this key (wrapping counter)
	Latest  int64  // Unix ns of the latest decision (keyNow)
	MaxExp  int64  // Unix ns of the latest lease end granted
	Writes  uint64 // rounds written (every write changes the header)
	Count   uint32 // ledger entries stored
	HeldSum uint64 // Σ held over the stored entries
	WinTag  uint64 // the window or slot FirstA counts in
	FirstA  uint64 // Σ granted of the assignment entries (RLQS streams) in WinTag (header.grantedA)
	RingAt  int64  // the ring's newest slot (Unix ns / ringSlot)
	Slots   uint8  // how many ringSlotFields follow
}

// ringSlotFields is one non-zero slot of the activity ring: entries whose last
// report fell in slot RingAt − Age, all of them and the assignment entries.
type ringSlotFields struct {
	Age      uint8
	All, Asg uint32
}

// entry is one Envoy's lease on a key ("e:" + its name), encoded as entryFields.
type entry struct {
	held uint64
	exp  int64
	tag  uint64
	last int64
	seq  uint64
	// granted: fixed_window and time_wheel: units granted to the Envoy under
	// tag, what it took of the window's budget (share).
	granted uint64
	// unspent: token_bucket and gcra: units of the lease's first grant not yet
	// credited back by a return.
	unspent uint64
}

// entryFields is an entry's encoding, little-endian, field by field.
type entryFields struct {
	Held uint64 // units granted and not returned
	Exp  int64  // Unix ns the lease ends (service clock); 0 = none
	Tag  uint64 // window end (fixed_window) or slot (time_wheel) of the lease
	Last int64  // Unix ns of the Envoy's last report for this key
	Seq  uint64 // total just after the lease's first grant (token_bucket, gcra)
	// First: entry.unspent (token_bucket, gcra) or entry.granted (fixed_window,
	// time_wheel): a key has one algorithm, so one slot holds whichever it uses.
	First uint64
}

const formatV2 = 2

// The encodings' sizes, in bytes, derived from their field lists.
var (
	headerFixedSize = binary.Size(headerFixed{})
	ringSlotSize    = binary.Size(ringSlotFields{})
	entrySize       = binary.Size(entryFields{})
)

var errFormat = errors.New("quota: stored value does not decode")

// activity counts a key's entries by when their Envoy last reported, in
// ringSlots slots of ringSlot: how many Envoys are active (reported within a
// retention) is a sum over the newest slots, without reading any entry.
type activity struct {
	at       int64 // newest slot
	all, asg [ringSlots]uint32
}

const (
	ringSlot  = 2 * time.Second
	ringSlots = 64
	// maxRetain is the longest an Envoy counts as active after its last report,
	// whatever its report interval: what the ring covers, less a slot.
	maxRetain = (ringSlots - 1) * ringSlot
	// forgetAfter is how long after an Envoy's last report its entry is removed
	// by the sweep (units it still holds stay counted: they were taken from the
	// budget when granted, and only a report can show them unspent).
	forgetAfter = 2 * time.Minute
)

func slotOf(t int64) int64 { return t / int64(ringSlot) }

// advance moves the newest slot to s, clearing the slots it passes.
func (r *activity) advance(s int64) {
	if s <= r.at {
		return
	}
	if s-r.at >= ringSlots {
		r.all, r.asg = [ringSlots]uint32{}, [ringSlots]uint32{}
	} else {
		for i := r.at + 1; i <= s; i++ {
			r.all[i%ringSlots], r.asg[i%ringSlots] = 0, 0
		}
	}
	r.at = s
}

func (r *activity) holds(s int64) bool { return s <= r.at && s > r.at-ringSlots }

// remove takes out an entry whose last report was at last (0: never counted).
func (r *activity) remove(last int64, asg bool) {
	if s := slotOf(last); last > 0 && r.holds(s) {
		i := s % ringSlots
		r.all[i] -= min(r.all[i], 1)
		if asg {
			r.asg[i] -= min(r.asg[i], 1)
		}
	}
}

// add counts an entry reporting at now (the ring advanced to it).
func (r *activity) add(now int64, asg bool) {
	r.advance(slotOf(now))
	i := slotOf(now) % ringSlots
	r.all[i]++
	if asg {
		r.asg[i]++
	}
}

// active returns how many entries reported within retain of now (to the slot:
// up to ringSlot more), all and assignment entries.
func (r *activity) active(now, retain int64) (all, asg uint64) {
	from := slotOf(now - min(retain, int64(maxRetain)))
	for s := max(from, r.at-ringSlots+1); s <= r.at; s++ {
		all += uint64(r.all[s%ringSlots])
		asg += uint64(r.asg[s%ringSlots])
	}
	return all, asg
}

// counts reports whether an entry whose last report was at last is among those
// active counts within retain of now.
func (r *activity) counts(last, now, retain int64) bool {
	s := slotOf(last)
	return last > 0 && r.holds(s) && s >= slotOf(now-min(retain, int64(maxRetain)))
}

func decodeHeader(b []byte, stateSize int) (header, error) {
	var h header
	if len(b) == 0 {
		return h, nil
	}
	if len(b) < 3 || b[0] != formatV2 {
		return header{}, errFormat
	}
	n := int(binary.LittleEndian.Uint16(b[1:3]))
	if n != stateSize || len(b) < 3+n+headerFixedSize {
		return header{}, errFormat
	}
	h.state = b[3 : 3+n]
	var f headerFixed
	if _, err := binary.Decode(b[3+n:], binary.LittleEndian, &f); err != nil {
		return header{}, errFormat
	}
	p := b[3+n+headerFixedSize:]
	if f.RingAt < 0 || len(p) != int(f.Slots)*ringSlotSize {
		// A negative slot index would index the ring below 0.
		return header{}, errFormat
	}
	h.total, h.latest, h.maxExp, h.writes = f.Total, f.Latest, f.MaxExp, f.Writes
	h.count, h.heldSum, h.winTag, h.grantedA, h.ring.at = f.Count, f.HeldSum, f.WinTag, f.FirstA, f.RingAt
	for range f.Slots {
		var rs ringSlotFields
		if _, err := binary.Decode(p, binary.LittleEndian, &rs); err != nil || rs.Age >= ringSlots {
			return header{}, errFormat
		}
		i := (h.ring.at - int64(rs.Age)) % ringSlots
		h.ring.all[i], h.ring.asg[i] = rs.All, rs.Asg
		p = p[ringSlotSize:]
	}
	return h, nil
}

func (h *header) encode(dst []byte) []byte {
	dst = append(dst, formatV2)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(h.state)))
	dst = append(dst, h.state...)
	var slots []ringSlotFields
	for age := int64(0); age < ringSlots && age <= h.ring.at; age++ {
		i := (h.ring.at - age) % ringSlots
		if h.ring.all[i] != 0 || h.ring.asg[i] != 0 {
			slots = append(slots, ringSlotFields{Age: uint8(age), All: h.ring.all[i], Asg: h.ring.asg[i]})
		}
	}
	dst, _ = binary.Append(dst, binary.LittleEndian, headerFixed{Total: h.total, Latest: h.latest, MaxExp: h.maxExp,
		Writes: h.writes, Count: h.count, HeldSum: h.heldSum, WinTag: h.winTag, FirstA: h.grantedA, RingAt: h.ring.at,
		Slots: uint8(len(slots))})
	for _, rs := range slots {
		dst, _ = binary.Append(dst, binary.LittleEndian, rs)
	}
	return dst
}

// decodeEntry decodes an entry of a key whose algorithm is windowed
// (fixed_window, time_wheel: First is granted) or not (First is unspent).
func decodeEntry(b []byte, windowed bool) (entry, bool) {
	var f entryFields
	if len(b) != entrySize {
		return entry{}, false
	}
	if _, err := binary.Decode(b, binary.LittleEndian, &f); err != nil {
		return entry{}, false
	}
	e := entry{held: f.Held, exp: f.Exp, tag: f.Tag, last: f.Last, seq: f.Seq}
	if windowed {
		e.granted = f.First
	} else {
		e.unspent = f.First
	}
	return e, true
}

// encode encodes e, of a windowed key or not (decodeEntry).
func (e *entry) encode(windowed bool) []byte {
	first := e.unspent
	if windowed {
		first = e.granted
	}
	b, _ := binary.Append(make([]byte, 0, entrySize), binary.LittleEndian,
		entryFields{Held: e.held, Exp: e.exp, Tag: e.tag, Last: e.last, Seq: e.seq, First: first})
	return b
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

// ownerOf returns the identity prefix (Owner) an entry name begins with, "" for
// a token caller's entry.
func ownerOf(name string) string {
	if len(name) > ownerLen && name[ownerLen-1] == '/' && name[:len(TokenOwner)] != TokenOwner {
		return name[:ownerLen]
	}
	return ""
}

// ownerLen is the length of Owner's prefixes.
const ownerLen = 17

// ledger is one key as a round sees it: the header, the entries of its askers
// and of the sweep, and what the round changed.
type ledger struct {
	// windowed: the key's algorithm counts windows or slots (fixed_window,
	// time_wheel), so an entry's First is its granted units (decodeEntry).
	windowed bool
	header
	entries map[string]*entry // loaded or created this round, by name
	owners  map[string]int64  // entries per owner: loaded, plus this round's changes
	dirty   map[string]bool   // entries to write
	removed []string          // entries to delete
	adds    map[string]int64  // owner count changes
	// maxEntries bounds count (Options.MaxEntriesPerKey).
	maxEntries uint32
	// sweepSoon asks for a sweep of the key at its next round: a newcomer found
	// it or its identity full.
	sweepSoon bool
}

func newLedger(h header) *ledger {
	return &ledger{header: h, entries: map[string]*entry{}, owners: map[string]int64{},
		dirty: map[string]bool{}, adds: map[string]int64{}}
}

// moveHeld changes heldSum for an entry that held from units and now holds to:
// the one rule every change of heldSum follows. It never wraps below zero (a
// sum that lost an entry's units, such as after a failed write, reads as 0).
func (h *header) moveHeld(from, to uint64) {
	h.heldSum -= min(h.heldSum, from)
	h.heldSum += to
}

// create adds an entry for name, counting it for its owner.
func (l *ledger) create(name string) *entry {
	e := &entry{}
	l.entries[name] = e
	l.count++
	if o := ownerOf(name); o != "" {
		l.owners[o]++
		l.adds[o]++
	}
	return e
}

// update records that the entry name changed from old (zero and fresh for a new
// one) to e: the aggregates follow, and the entry is written.
func (l *ledger) update(name string, old entry, fresh bool, e *entry, tag uint64) {
	asg := assignmentEntry(name)
	l.moveHeld(old.held, e.held)
	if l.winTag != tag {
		l.winTag, l.grantedA = tag, 0
	}
	if asg {
		if !fresh && old.tag == l.winTag {
			l.grantedA -= min(l.grantedA, old.granted)
		}
		if e.tag == l.winTag {
			l.grantedA += e.granted
		}
	}
	if !fresh {
		l.ring.remove(old.last, asg)
	}
	l.ring.add(e.last, asg)
	l.maxExp = max(l.maxExp, e.exp)
	l.latest = max(l.latest, e.last)
	l.dirty[name] = true
}

// forget removes the stored entry name (e) from the ledger.
func (l *ledger) forget(name string, e *entry) {
	l.moveHeld(e.held, 0)
	asg := assignmentEntry(name)
	if asg && e.tag == l.winTag {
		l.grantedA -= min(l.grantedA, e.granted)
	}
	l.ring.remove(e.last, asg)
	l.count -= min(l.count, 1)
	if o := ownerOf(name); o != "" {
		l.owners[o]--
		l.adds[o]--
	}
	delete(l.entries, name)
	delete(l.dirty, name)
	l.removed = append(l.removed, name)
}

// sweep removes, of the entries a scan returned, those whose Envoy has not
// reported for forgetAfter (a pod gone in a rollout: its units stay counted),
// and clears the units of ended leases from the others, so that heldSum stays
// what the live leases hold. Under pressure (a newcomer found the key or its
// identity full) it also removes every entry that can give way (giveWay).
// Entries this round already holds are skipped.
// sweepPressure is who may lose an entry early in a sweep (Service.pressure):
// every entry (all), or the entries of these owners.
type sweepPressure struct {
	all    bool
	owners map[string]bool
}

// on reports whether the entry name is under pressure.
func (p sweepPressure) on(name string) bool {
	return p.all || p.owners[ownerOf(name)]
}

func (l *ledger) sweep(scanned []Field, now int64, pressure sweepPressure) (forgotten int) {
	for _, f := range scanned {
		name, ok := cutPrefix(f.Name, entryPrefix)
		if !ok || l.entries[name] != nil {
			continue
		}
		e, ok := decodeEntry(f.Value, l.windowed)
		if !ok {
			continue
		}
		switch {
		case e.last+int64(forgetAfter) <= now, pressure.on(name) && giveWay(&e, now, retainFor(0)) > 0:
			l.forget(name, &e)
			forgotten++
		case e.held > 0 && e.exp <= now:
			l.moveHeld(e.held, 0)
			e.held, e.exp = 0, 0
			l.entries[name] = &e
			l.dirty[name] = true
		}
	}
	return forgotten
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) < len(p) || s[:len(p)] != p {
		return s, false
	}
	return s[len(p):], true
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
