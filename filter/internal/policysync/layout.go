package policysync

import (
	"encoding/binary"
	"hash/fnv"
	"strconv"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// ChunkBytes is the largest document slice stored under one chunk key, in
// bytes: 64 KiB. Every shared-data read copies the whole value into the VM,
// so a reader pays for what it reads and no more.
const ChunkBytes = 64 << 10

// MaxChunks is the number of chunk keys a policy document can need:
// rules.MaxPolicyBytes / ChunkBytes (16).
const MaxChunks = (rules.MaxPolicyBytes + ChunkBytes - 1) / ChunkBytes

// MaxETagBytes is the longest ETag kept in the published meta, in bytes;
// a longer one is not stored (the next lease holder then polls without
// If-None-Match once).
const MaxETagBytes = 256

// LeaseKey returns the shared-data key of the sync lease of policy:
// "sluice/sync/<policy>/lease".
func LeaseKey(policy string) string { return "sluice/sync/" + policy + "/lease" }

// MetaKey returns the shared-data key of the published policy's Meta:
// "sluice/policy/<policy>/meta".
func MetaKey(policy string) string { return "sluice/policy/" + policy + "/meta" }

// ChunkKey returns the shared-data key of chunk i (0 ≤ i < MaxChunks) of
// publication generation gen: "sluice/policy/<policy>/chunk/<gen>/<i>".
// Each generation is claimed by exactly one publisher (Meta.Claimed), so no
// two publishers ever write the same chunk key.
func ChunkKey(policy string, gen uint64, i int) string {
	return "sluice/policy/" + policy + "/chunk/" + strconv.FormatUint(gen, 10) + "/" + strconv.Itoa(i)
}

// Lease is the value of the lease key: which VM holds the sync lease and
// until when. The zero Lease is free.
type Lease struct {
	// Holder is the holding VM's token, a random non-zero 64-bit value drawn
	// by each plugin instance at start; 0 means nobody.
	Holder uint64
	// ExpiryNanos is when the lease lapses, in Unix nanoseconds of the
	// host clock (time.Now in the VM).
	ExpiryNanos int64
}

// An encoded Lease, field by field (little-endian); offsets and size follow
// from the list.
const (
	leaseHolder = 0               // uint64
	leaseExpiry = leaseHolder + 8 // int64, Unix ns
	leaseBytes  = leaseExpiry + 8 // 16 bytes
)

// AppendLease appends the 16-byte encoding of l to dst.
func AppendLease(dst []byte, l Lease) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, l.Holder)
	return binary.LittleEndian.AppendUint64(dst, uint64(l.ExpiryNanos))
}

// DecodeLease decodes a lease value. Anything but exactly 16 bytes reads as
// the zero (free) Lease with ok false, so a corrupted lease is taken over by
// the next worker's CAS rather than blocking sync forever.
func DecodeLease(b []byte) (l Lease, ok bool) {
	if len(b) != leaseBytes {
		return Lease{}, false
	}
	return Lease{
		Holder:      binary.LittleEndian.Uint64(b[leaseHolder:]),
		ExpiryNanos: int64(binary.LittleEndian.Uint64(b[leaseExpiry:])),
	}, true
}

// Meta describes the published policy; it is the value of the meta key.
// The meta key is the only key two publishers contend on, and every write
// to it is a compare-and-swap: one claims a generation, one commits a
// publication (see the package documentation).
type Meta struct {
	// Version is the policy document's version (rules.Policy.Version), which
	// the control plane bumps on every change; 0 with Generation 0.
	Version uint64
	// Generation names the published document's chunk keys (ChunkKey); 0
	// means nothing is published yet. Generations only grow.
	Generation uint64
	// Claimed is the highest generation handed out to a publisher (≥
	// Generation). A publisher claims Claimed+1 by compare-and-swap before
	// writing any chunk, so it owns that generation's chunk keys alone.
	Claimed uint64
	// Length is the document's length in bytes (≤ rules.MaxPolicyBytes).
	Length uint32
	// Chunks is the number of chunks: ceil(Length / ChunkBytes).
	Chunks uint32
	// Checksum is the 64-bit FNV-1a hash of the whole document.
	Checksum uint64
	// ETag is the control plane's ETag for this version (quoted, as
	// received; at most MaxETagBytes), so a new lease holder polls with
	// If-None-Match at once. May be empty.
	ETag string
}

// Published reports whether m names a published document (Generation ≥ 1).
func (m Meta) Published() bool { return m.Generation != 0 }

// Deleted reports whether m publishes the policy's deletion: a publication of
// an empty document (a policy document is never empty), at the version the
// control plane's deletion has.
func (m Meta) Deleted() bool { return m.Generation != 0 && m.Length == 0 }

// metaMagic starts every encoded Meta: the format's name and revision.
const metaMagic = "SPM2"

// An encoded Meta before its ETag bytes, field by field (little-endian);
// offsets and metaFixedBytes follow from the list.
const (
	metaVersion    = len(metaMagic)     // uint64
	metaGeneration = metaVersion + 8    // uint64
	metaClaimed    = metaGeneration + 8 // uint64
	metaLength     = metaClaimed + 8    // uint32
	metaChunks     = metaLength + 4     // uint32
	metaChecksum   = metaChunks + 4     // uint64
	metaETagLen    = metaChecksum + 8   // uint16
	metaFixedBytes = metaETagLen + 2    // 46 bytes
)

// AppendMeta appends the encoding of m to dst: "SPM2", then little-endian
// version u64, generation u64, claimed u64, length u32, chunks u32,
// checksum u64, ETag length u16 and the ETag bytes. An ETag longer than
// MaxETagBytes is encoded as empty.
func AppendMeta(dst []byte, m Meta) []byte {
	etag := m.ETag
	if len(etag) > MaxETagBytes {
		etag = ""
	}
	dst = append(dst, metaMagic...)
	dst = binary.LittleEndian.AppendUint64(dst, m.Version)
	dst = binary.LittleEndian.AppendUint64(dst, m.Generation)
	dst = binary.LittleEndian.AppendUint64(dst, m.Claimed)
	dst = binary.LittleEndian.AppendUint32(dst, m.Length)
	dst = binary.LittleEndian.AppendUint32(dst, m.Chunks)
	dst = binary.LittleEndian.AppendUint64(dst, m.Checksum)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(etag)))
	return append(dst, etag...)
}

// DecodeMeta decodes a meta value strictly: the magic, the exact length,
// Length ≤ rules.MaxPolicyBytes, Chunks = ceil(Length / ChunkBytes) and
// Claimed ≥ Generation must all hold, and a Meta with Generation 0 must
// have Version, Length and Chunks 0; else ok is false. The empty value
// (the meta key as created, before any claim) decodes as the zero Meta
// with ok true. It never panics.
func DecodeMeta(b []byte) (m Meta, ok bool) {
	if len(b) == 0 {
		return Meta{}, true
	}
	if len(b) < metaFixedBytes || string(b[:metaVersion]) != metaMagic {
		return Meta{}, false
	}
	le := binary.LittleEndian
	m.Version = le.Uint64(b[metaVersion:])
	m.Generation = le.Uint64(b[metaGeneration:])
	m.Claimed = le.Uint64(b[metaClaimed:])
	m.Length = le.Uint32(b[metaLength:])
	m.Chunks = le.Uint32(b[metaChunks:])
	m.Checksum = le.Uint64(b[metaChecksum:])
	n := int(le.Uint16(b[metaETagLen:]))
	if len(b) != metaFixedBytes+n || n > MaxETagBytes {
		return Meta{}, false
	}
	m.ETag = string(b[metaFixedBytes:])
	if m.Claimed < m.Generation || m.Length > rules.MaxPolicyBytes || m.Chunks != chunkCount(int(m.Length)) ||
		(m.Generation == 0 && (m.Version != 0 || m.Length != 0)) {
		return Meta{}, false
	}
	return m, true
}

// chunkCount returns ceil(n / ChunkBytes).
func chunkCount(n int) uint32 { return uint32((n + ChunkBytes - 1) / ChunkBytes) }

// Checksum returns the 64-bit FNV-1a hash of doc, as stored in Meta.
func Checksum(doc []byte) uint64 {
	h := fnv.New64a()
	h.Write(doc)
	return h.Sum64()
}

// chunkHeaderBytes is the generation prefix of every chunk value.
const chunkHeaderBytes = 8

// Chunks splits doc into the values of its chunk keys for generation gen:
// each is gen (u64 little-endian) followed by up to ChunkBytes bytes of doc.
// An empty doc has no chunks.
func Chunks(doc []byte, gen uint64) [][]byte {
	out := make([][]byte, 0, chunkCount(len(doc)))
	for off := 0; off < len(doc); off += ChunkBytes {
		end := min(off+ChunkBytes, len(doc))
		v := make([]byte, 0, chunkHeaderBytes+end-off)
		v = binary.LittleEndian.AppendUint64(v, gen)
		out = append(out, append(v, doc[off:end]...))
	}
	return out
}

// Assembler rebuilds a document from its chunk values, checking each
// against the Meta it was published under.
type Assembler struct {
	meta Meta
	doc  []byte
	next int
	void bool
}

// NewAssembler starts assembling the document m describes.
func NewAssembler(m Meta) *Assembler {
	return &Assembler{meta: m, doc: make([]byte, 0, m.Length)}
}

// Add appends chunk i's value. It returns false (and the assembly is
// void) if chunks come out of order, if the value is not of m's
// generation, or if it would make the document longer than m.Length or
// leave a chunk other than the last short.
func (a *Assembler) Add(i int, v []byte) bool {
	if a.void || i != a.next || i >= int(a.meta.Chunks) || len(v) < chunkHeaderBytes ||
		binary.LittleEndian.Uint64(v) != a.meta.Generation {
		a.void = true
		return false
	}
	data := v[chunkHeaderBytes:]
	want := min(ChunkBytes, int(a.meta.Length)-len(a.doc))
	if len(data) != want {
		a.void = true
		return false
	}
	a.doc = append(a.doc, data...)
	a.next++
	return true
}

// Document returns the assembled document if every chunk was added and its
// length and checksum match the Meta; otherwise ok is false (a torn or
// corrupted read).
func (a *Assembler) Document() (doc []byte, ok bool) {
	if a.void || a.next != int(a.meta.Chunks) || len(a.doc) != int(a.meta.Length) || Checksum(a.doc) != a.meta.Checksum {
		return nil, false
	}
	return a.doc, true
}
