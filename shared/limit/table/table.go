// Package table is the binary layout of one shared-data bucket: a fixed-capacity table
// of rate-limit entries (key hash, idle time, algorithm state) plus one overflow state,
// that all worker VMs of an Envoy read and compare-and-swap.
//
// A rule owns a fixed number of buckets; BucketOf maps a key hash (siphash of the
// client key under the per-Envoy secret) to one of them, and the key takes one entry of
// that bucket's table. Memory is buckets × Layout.Size() bytes per rule, whatever the
// number of distinct keys.
//
// Within a bucket, Lookup scans every entry (a bucket holds at most MaxEntries) and
// picks, in order: the key's own entry; else the first reusable entry (never used, or
// idle: its stored idle time has passed, so its state equals a fresh key's); else the
// bucket's overflow state, and reports Overflow.
//
// # Full-bucket policy: a shared overflow state, never an eviction
//
// A live entry (one whose state is not yet that of a fresh key) is never taken from
// its key, so a key's count is never forgotten while it matters. A key that finds
// every entry live is decided against, and charged to, the bucket's overflow state,
// which every key without an entry shares (as a count-min sketch shares a counter):
// the overflow has counted at least everything such a key was admitted, so the key
// never gets more than its own limit. When a key without an entry later finds an idle
// entry, the entry starts from the overflow state (fresh if the overflow is idle), not
// from a fresh one, because part of what the overflow counts may be the key's own.
// Corrections (Current) of a key without an entry go to the overflow too.
//
// The bound: no key is ever admitted beyond its own limit, whatever the number of
// keys. The price, paid only while a bucket's entries are all live: keys without an
// entry share one limit between them (and a key taking an entry inherits what the
// overflow holds until it goes idle), so they may be limited before their own limit.
// The alternatives were worse: evicting a live entry (even the one that goes idle
// soonest) let two keys that take turns evicting each other start fresh every time, so
// neither was ever limited; denying every key without an entry makes a full bucket
// fail closed for newcomers even when the overflow has room. Size buckets × entries
// above the number of keys live at once, and watch the overflow counter.
//
// # Bucket layout (little-endian)
//
//	header (16 bytes)
//	  [0]      magic 's' (0x73)
//	  [1]      FormatVersion
//	  [2]      algorithm (limit.Algorithm)
//	  [3]      0
//	  [4:8]    fingerprint uint32 (limit.Limiter.Fingerprint: algorithm and parameters)
//	  [8:10]   entries uint16
//	  [10:12]  0
//	  [12:16]  state size uint32 (limit.Limiter.StateSize)
//	(entries + 1) × (16 + state size) bytes, record i at 16 + i·(16 + state size);
//	records 0..entries-1 are the entries, record `entries` is the overflow:
//	  [0:8]    key hash uint64 (0 = never used; a key hashing to 0 is stored as 1;
//	           always 0 in the overflow record)
//	  [8:16]   idle at int64, Unix ns (limit.Limiter.IdleAt of the state when written)
//	  [16:]    algorithm state
//
// A bucket whose header names another version, algorithm, definition (fingerprint),
// entry count or state size is Stale: a rule whose definition changed starts fresh
// instead of misreading old state. Bytes that are not a bucket at all (wrong length,
// no magic, nonzero reserved bytes: shared data written by another plugin sharing the
// vm_id, or truncated) are Corrupt and also read as an empty table. Either way the
// next Commit rewrites the whole bucket. Lookup never panics on any bytes.
package table

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// FormatVersion is the bucket layout version in byte 1 of the header (2: with the
// overflow record; buckets of version 1 read as Stale).
const FormatVersion = 2

const magic = 's'

// The header, field by field; offsets and size follow from the list.
const (
	hMagic       = 0                // byte: magic
	hVersion     = hMagic + 1       // byte: FormatVersion
	hAlgorithm   = hVersion + 1     // byte: limit.Algorithm
	hReserved1   = hAlgorithm + 1   // byte: 0
	hFingerprint = hReserved1 + 1   // uint32
	hEntries     = hFingerprint + 4 // uint16
	hReserved2   = hEntries + 2     // 2 bytes: 0
	hStateSize   = hReserved2 + 2   // uint32
	headerSize   = hStateSize + 4   // 16 bytes
)

// A record's head, field by field, before the algorithm state.
const (
	rKey      = 0        // uint64: key hash
	rIdleAt   = rKey + 8 // int64: Unix ns
	entryHead = rIdleAt + 8
)

// MaxEntries is the largest number of entries in one bucket.
const MaxEntries = 64

// MaxBucketSize is the largest bucket, in bytes (shared data values are copied whole
// into the VM on every read).
const MaxBucketSize = 32 << 10

// ErrLayout is matched (errors.Is) by New's errors.
var ErrLayout = errors.New("table: invalid layout")

type layoutError struct{ msg string }

func (e *layoutError) Error() string        { return e.msg }
func (e *layoutError) Is(target error) bool { return target == ErrLayout }

// Layout is the bucket format of one rule: its limiter and entry count. It is
// immutable and safe for concurrent use.
type Layout struct {
	lim       limit.Limiter
	entries   int
	stateSize int
	entrySize int
	size      int
	header    [headerSize]byte
	// head0 and head1 are header as two little-endian words, compared
	// with a bucket's without a call to the runtime's memequal.
	head0, head1 uint64
}

// New returns the Layout of buckets of entries entries (1..MaxEntries) of l's state,
// plus the overflow record. It fails if the bucket would exceed MaxBucketSize bytes.
func New(l limit.Limiter, entries int) (*Layout, error) {
	if l == nil {
		return nil, &layoutError{"table: nil limiter"}
	}
	if entries < 1 || entries > MaxEntries {
		return nil, &layoutError{"table: entries must be 1.." + strconv.Itoa(MaxEntries) + ", got " + strconv.Itoa(entries)}
	}
	t := &Layout{lim: l, entries: entries, stateSize: l.StateSize()}
	t.entrySize = entryHead + t.stateSize
	t.size = headerSize + (entries+1)*t.entrySize
	if t.size > MaxBucketSize {
		return nil, &layoutError{"table: bucket of " + strconv.Itoa(entries) + " entries of " +
			strconv.Itoa(t.stateSize) + "-byte state is " + strconv.Itoa(t.size) + " bytes, more than " + strconv.Itoa(MaxBucketSize)}
	}
	h := &t.header
	h[hMagic], h[hVersion], h[hAlgorithm] = magic, FormatVersion, byte(l.Config().Algorithm)
	binary.LittleEndian.PutUint32(h[hFingerprint:], l.Fingerprint())
	binary.LittleEndian.PutUint16(h[hEntries:], uint16(entries))
	binary.LittleEndian.PutUint32(h[hStateSize:], uint32(t.stateSize))
	t.head0, t.head1 = binary.LittleEndian.Uint64(h[0:8]), binary.LittleEndian.Uint64(h[8:16])
	return t, nil
}

// Size is the length in bytes of a bucket: 16 + (entries+1)·(16 + state size).
func (t *Layout) Size() int { return t.size }

// Entries is the number of entries in a bucket (the overflow record not included).
func (t *Layout) Entries() int { return t.entries }

// Limiter is the limiter whose state the entries hold.
func (t *Layout) Limiter() limit.Limiter { return t.lim }

// BucketOf maps a key hash to a bucket index in [0, buckets) (buckets >= 1), using the
// high bits of keyHash (Lemire's multiply-shift reduction: uniform for a uniform hash,
// no division). Returns 0 if buckets < 1.
func BucketOf(keyHash uint64, buckets int) int {
	if buckets < 1 {
		return 0
	}
	hi, _ := bits.Mul64(keyHash, uint64(buckets))
	return int(hi)
}

// Status says what Lookup found in the bucket bytes.
type Status uint8

const (
	// OK: a well-formed bucket of this layout.
	OK Status = iota
	// Empty: no bytes (the shared-data key was never written).
	Empty
	// Stale: a sluice bucket of another format version, algorithm, rule definition or
	// size; read as an empty table (expected once after a rule changes).
	Stale
	// Corrupt: bytes that are not a sluice bucket; read as an empty table (count it).
	Corrupt
)

var statusNames = [...]string{OK: "ok", Empty: "empty", Stale: "stale", Corrupt: "corrupt"}

// String returns "ok", "empty", "stale" or "corrupt".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// Slot is the record a key uses in one bucket, as found by Lookup or Current.
type Slot struct {
	// Index is the record index: an entry in [0, Entries), or Entries for the overflow.
	Index int
	// State is the state the key is decided against, a read-only subslice of the
	// bucket: its own entry's when Found; else the overflow state (nil when that is
	// idle, or the bucket is not OK: a Limiter reads nil as a fresh key).
	State []byte
	// Found reports whether the key already had this entry.
	Found bool
	// Overflow reports that every entry is live and the key has none: Index is the
	// overflow record, which Commit will update (see the full-bucket policy).
	Overflow bool
	// Status describes the bucket bytes.
	Status Status
}

// check classifies bucket.
func (t *Layout) check(b []byte) Status {
	switch {
	case len(b) == 0:
		return Empty
	case len(b) < headerSize || b[hMagic] != magic || b[hReserved1] != 0 || b[hReserved2] != 0 || b[hReserved2+1] != 0:
		return Corrupt
	case b[hVersion] != FormatVersion:
		return Stale
	}
	n := int(binary.LittleEndian.Uint16(b[hEntries:]))
	ss := int(binary.LittleEndian.Uint32(b[hStateSize:]))
	if ss > MaxBucketSize || len(b) != headerSize+(n+1)*(entryHead+ss) {
		return Corrupt
	}
	if binary.LittleEndian.Uint64(b[0:8]) != t.head0 || binary.LittleEndian.Uint64(b[8:16]) != t.head1 {
		return Stale
	}
	return OK
}

func normKey(k uint64) uint64 {
	if k == 0 {
		return 1
	}
	return k
}

// Lookup finds the record keyHash uses in bucket at now, by the policy in the package
// doc. It never allocates, never modifies bucket and never panics.
func (t *Layout) Lookup(bucket []byte, keyHash uint64, now int64) Slot {
	st := t.check(bucket)
	if st != OK {
		return Slot{Status: st} // index 0 of an empty table
	}
	key := normKey(keyHash)
	free := -1
	off := headerSize
	for i := 0; i < t.entries; i, off = i+1, off+t.entrySize {
		k := binary.LittleEndian.Uint64(bucket[off+rKey:])
		if k == key {
			return Slot{Index: i, State: bucket[off+entryHead : off+t.entrySize], Found: true}
		}
		if free < 0 && (k == 0 || int64(binary.LittleEndian.Uint64(bucket[off+rIdleAt:])) <= now) {
			free = i
		}
	}
	var ov []byte // off is the overflow record's
	if int64(binary.LittleEndian.Uint64(bucket[off+rIdleAt:])) > now {
		ov = bucket[off+entryHead : off+t.entrySize]
	}
	if free >= 0 {
		return Slot{Index: free, State: ov}
	}
	return Slot{Index: t.entries, State: ov, Overflow: true}
}

// Current finds where keyHash's charges are counted now, for a correction of an
// earlier charge (limit.Limiter.Adjust or Release): its own entry (Found), else the
// overflow record (Overflow), whose State is then always the stored bytes. If bucket
// is not an OK bucket of this layout it returns neither (there is nothing to correct).
// It never allocates, never modifies bucket and never panics.
func (t *Layout) Current(bucket []byte, keyHash uint64) Slot {
	st := t.check(bucket)
	if st != OK {
		return Slot{Status: st}
	}
	key := normKey(keyHash)
	off := headerSize
	for i := 0; i < t.entries; i, off = i+1, off+t.entrySize {
		if binary.LittleEndian.Uint64(bucket[off+rKey:]) == key {
			return Slot{Index: i, State: bucket[off+entryHead : off+t.entrySize], Found: true}
		}
	}
	return Slot{Index: t.entries, State: bucket[off+entryHead : off+t.entrySize], Overflow: true}
}

// Commit writes into dst the bucket to store: bucket (or, unless s.Status is OK, an
// empty table) with record s.Index set to keyHash (0 for the overflow record),
// next[:StateSize] and its idle time (Limiter.IdleAt(next, now)). dst must have capacity >= Size() (it panics otherwise,
// a programming error); it may be bucket itself, to update in place. It returns
// dst[:Size()] and does not allocate.
func (t *Layout) Commit(dst, bucket []byte, s Slot, keyHash uint64, next []byte, now int64) []byte {
	return t.CommitAs(t.lim, dst, bucket, s, keyHash, next, now)
}

// CommitAs is Commit with the record's idle time stamped by lim, the limiter
// that wrote next, in place of the layout's own: one whose states have the
// layout's size and encoding but may reach further ahead (a degraded fleet rule
// decided by the rule refilled n times slower), so that the record is not taken
// for idle, and reused by another key, while lim still counts it. lim must have
// the layout's StateSize.
func (t *Layout) CommitAs(lim limit.Limiter, dst, bucket []byte, s Slot, keyHash uint64, next []byte, now int64) []byte {
	dst = dst[:t.size]
	if s.Status == OK && len(bucket) == t.size {
		copy(dst, bucket)
	} else {
		copy(dst, t.header[:])
		clear(dst[headerSize:])
	}
	i := s.Index
	if i < 0 || i > t.entries || (i == t.entries && !s.Overflow) {
		i = 0
	}
	off := headerSize + i*t.entrySize
	state := next[:t.stateSize]
	if i == t.entries {
		binary.LittleEndian.PutUint64(dst[off+rKey:], 0)
	} else {
		binary.LittleEndian.PutUint64(dst[off+rKey:], normKey(keyHash))
	}
	binary.LittleEndian.PutUint64(dst[off+rIdleAt:], uint64(lim.IdleAt(state, now)))
	copy(dst[off+entryHead:off+t.entrySize], state)
	return dst
}

// Entry returns record i of a bucket of this layout (for inspection and tests): its
// key hash (0 if never used, and for the overflow record i = Entries), idle time and
// state (a subslice of bucket). ok is false if bucket is not an OK bucket of this
// layout or i is out of range [0, Entries].
func (t *Layout) Entry(bucket []byte, i int) (keyHash uint64, idleAt int64, state []byte, ok bool) {
	if t.check(bucket) != OK || i < 0 || i > t.entries {
		return 0, 0, nil, false
	}
	off := headerSize + i*t.entrySize
	return binary.LittleEndian.Uint64(bucket[off+rKey:]), int64(binary.LittleEndian.Uint64(bucket[off+rIdleAt:])),
		bucket[off+entryHead : off+t.entrySize], true
}
