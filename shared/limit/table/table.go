// Package table is the binary layout of one shared-data bucket: a fixed-capacity table
// of rate-limit entries (key hash, idle time, algorithm state) that all worker VMs of an
// Envoy read and compare-and-swap (docs/ARCHITECTURE.md, The request path).
//
// A rule owns a fixed number of buckets; BucketOf maps a key hash (siphash of the
// client key under the per-Envoy secret) to one of them, and the key takes one entry of
// that bucket's table. Memory is buckets × Layout.Size() bytes per rule, whatever the
// number of distinct keys.
//
// Within a bucket, Lookup scans every entry (a bucket holds at most MaxEntries) and
// picks, in order: the key's own entry; else the first reusable entry (never used, or
// idle: its stored idle time has passed, so its state equals a fresh key's); else it
// evicts the live entry that would become idle soonest and reports Evicted.
//
// # Full-bucket policy
//
// When every entry is live, the newcomer takes the entry of the key whose state will
// be forgotten soonest anyway (smallest idle time, lowest index on ties), and
// Slot.Evicted is set for the filter to count. Only that evicted key loses exactness:
// its next request is judged as a fresh key, so it can be admitted up to one extra
// limit (bucket capacity) beyond the bound, once per eviction; every other key stays
// exact. The alternatives are worse for a rate limiter: denying the newcomer (fail
// closed) lets anyone who fills a bucket with live keys lock every other key of that
// bucket out; not tracking the newcomer (fail open) makes every new key unlimited
// while buckets are full; evicting the least recently used entry would let a client
// rotating keys flush the state of the most restricted keys (longest idle time) first,
// where soonest-idle flushes the cheapest state and keeps the keys being limited
// hardest. Size buckets × entries above the number of keys live at once.
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
//	entries × (16 + state size) bytes, entry i at 16 + i·(16 + state size):
//	  [0:8]    key hash uint64 (0 = never used; a key hashing to 0 is stored as 1)
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

// FormatVersion is the bucket layout version in byte 1 of the header.
const FormatVersion = 1

const (
	magic      = 's'
	headerSize = 16
	entryHead  = 16
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
}

// New returns the Layout of buckets of entries entries (1..MaxEntries) of l's state.
// It fails if the bucket would exceed MaxBucketSize bytes.
func New(l limit.Limiter, entries int) (*Layout, error) {
	if l == nil {
		return nil, &layoutError{"table: nil limiter"}
	}
	if entries < 1 || entries > MaxEntries {
		return nil, &layoutError{"table: entries must be 1.." + strconv.Itoa(MaxEntries) + ", got " + strconv.Itoa(entries)}
	}
	t := &Layout{lim: l, entries: entries, stateSize: l.StateSize()}
	t.entrySize = entryHead + t.stateSize
	t.size = headerSize + entries*t.entrySize
	if t.size > MaxBucketSize {
		return nil, &layoutError{"table: bucket of " + strconv.Itoa(entries) + " entries of " +
			strconv.Itoa(t.stateSize) + "-byte state is " + strconv.Itoa(t.size) + " bytes, more than " + strconv.Itoa(MaxBucketSize)}
	}
	h := &t.header
	h[0], h[1], h[2] = magic, FormatVersion, byte(l.Config().Algorithm)
	binary.LittleEndian.PutUint32(h[4:], l.Fingerprint())
	binary.LittleEndian.PutUint16(h[8:], uint16(entries))
	binary.LittleEndian.PutUint32(h[12:], uint32(t.stateSize))
	return t, nil
}

// Size is the length in bytes of a bucket: 16 + entries·(16 + state size).
func (t *Layout) Size() int { return t.size }

// Entries is the number of entries in a bucket.
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

// Slot is the entry a key uses in one bucket, as found by Lookup.
type Slot struct {
	// Index is the entry index in [0, Entries).
	Index int
	// State is the key's current state: a read-only subslice of the bucket when Found,
	// nil otherwise (a Limiter reads nil as a fresh key).
	State []byte
	// Found reports whether the key already had this entry.
	Found bool
	// Evicted reports that Index holds a live entry of another key, which Commit will
	// overwrite (see the full-bucket policy in the package doc).
	Evicted bool
	// Status describes the bucket bytes.
	Status Status
}

// check classifies bucket.
func (t *Layout) check(b []byte) Status {
	switch {
	case len(b) == 0:
		return Empty
	case len(b) < headerSize || b[0] != magic || b[3] != 0 || b[10] != 0 || b[11] != 0:
		return Corrupt
	case b[1] != FormatVersion:
		return Stale
	}
	n := int(binary.LittleEndian.Uint16(b[8:]))
	ss := int(binary.LittleEndian.Uint32(b[12:]))
	if ss > MaxBucketSize || len(b) != headerSize+n*(entryHead+ss) {
		return Corrupt
	}
	if [headerSize]byte(b[:headerSize]) != t.header {
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

// Lookup finds the entry of keyHash in bucket at now (Unix ns), by the policy in the
// package doc. It never allocates, never modifies bucket and never panics.
func (t *Layout) Lookup(bucket []byte, keyHash uint64, now int64) Slot {
	st := t.check(bucket)
	if st != OK {
		return Slot{Status: st} // index 0 of an empty table
	}
	key := normKey(keyHash)
	free, victim := -1, 0
	victimIdle := int64(1<<63 - 1)
	off := headerSize
	for i := 0; i < t.entries; i, off = i+1, off+t.entrySize {
		k := binary.LittleEndian.Uint64(bucket[off:])
		if k == key {
			return Slot{Index: i, State: bucket[off+entryHead : off+t.entrySize], Found: true}
		}
		idle := int64(binary.LittleEndian.Uint64(bucket[off+8:]))
		if k == 0 || idle <= now {
			if free < 0 {
				free = i
			}
		} else if idle < victimIdle {
			victim, victimIdle = i, idle
		}
	}
	if free >= 0 {
		return Slot{Index: free}
	}
	return Slot{Index: victim, Evicted: true}
}

// Commit writes into dst the bucket to store: bucket (or, unless s.Status is OK, an
// empty table) with entry s.Index set to keyHash, next[:StateSize] and its idle time
// (Limiter.IdleAt(next, now)). dst must have capacity >= Size() (it panics otherwise,
// a programming error); it may be bucket itself, to update in place. It returns
// dst[:Size()] and does not allocate.
func (t *Layout) Commit(dst, bucket []byte, s Slot, keyHash uint64, next []byte, now int64) []byte {
	dst = dst[:t.size]
	if s.Status == OK && len(bucket) == t.size {
		copy(dst, bucket)
	} else {
		copy(dst, t.header[:])
		clear(dst[headerSize:])
	}
	i := s.Index
	if i < 0 || i >= t.entries {
		i = 0
	}
	off := headerSize + i*t.entrySize
	state := next[:t.stateSize]
	binary.LittleEndian.PutUint64(dst[off:], normKey(keyHash))
	binary.LittleEndian.PutUint64(dst[off+8:], uint64(t.lim.IdleAt(state, now)))
	copy(dst[off+entryHead:off+t.entrySize], state)
	return dst
}

// Entry returns entry i of a bucket of this layout (for inspection and tests): its key
// hash (0 if never used), idle time and state (a subslice of bucket). ok is false if
// bucket is not an OK bucket of this layout or i is out of range.
func (t *Layout) Entry(bucket []byte, i int) (keyHash uint64, idleAt int64, state []byte, ok bool) {
	if t.check(bucket) != OK || i < 0 || i >= t.entries {
		return 0, 0, nil, false
	}
	off := headerSize + i*t.entrySize
	return binary.LittleEndian.Uint64(bucket[off:]), int64(binary.LittleEndian.Uint64(bucket[off+8:])),
		bucket[off+entryHead : off+t.entrySize], true
}
