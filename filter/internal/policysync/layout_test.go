package policysync

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/shared/rules"
)

func TestKeys(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"lease", LeaseKey("default"), "sluice/sync/default/lease"},
		{"meta", MetaKey("default"), "sluice/policy/default/meta"},
		{"chunk 1/0", ChunkKey("default", 1, 0), "sluice/policy/default/chunk/1/0"},
		{"chunk 1/15", ChunkKey("default", 1, 15), "sluice/policy/default/chunk/1/15"},
		{"generation 3, chunk 2", ChunkKey("p", 3, 2), "sluice/policy/p/chunk/3/2"},
		{"generation 2^64-1", ChunkKey("p", 1<<64-1, 0), "sluice/policy/p/chunk/18446744073709551615/0"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if MaxChunks != 16 {
		t.Errorf("MaxChunks = %d, want 16 (1 MiB / 64 KiB)", MaxChunks)
	}
}

func TestLeaseRoundTrip(t *testing.T) {
	for _, l := range []Lease{{}, {Holder: 1, ExpiryNanos: -5}, {Holder: ^uint64(0), ExpiryNanos: 1<<63 - 1}} {
		b := AppendLease(nil, l)
		if len(b) != 16 {
			t.Fatalf("AppendLease(%+v) is %d bytes, want 16", l, len(b))
		}
		got, ok := DecodeLease(b)
		if !ok || got != l {
			t.Errorf("DecodeLease(AppendLease(%+v)) = %+v, %v", l, got, ok)
		}
	}
}

func TestDecodeLeaseMalformed(t *testing.T) {
	for _, b := range [][]byte{nil, {}, make([]byte, 15), make([]byte, 17)} {
		if l, ok := DecodeLease(b); ok || l != (Lease{}) {
			t.Errorf("DecodeLease(%d bytes) = %+v, %v; want the free lease, false", len(b), l, ok)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []Meta{
		{Version: 7, Generation: 1, Claimed: 1, Length: 0, Chunks: 0, Checksum: Checksum(nil), ETag: ""},
		{Version: 1<<64 - 1, Generation: 2, Claimed: 5, Length: 1, Chunks: 1, Checksum: 42, ETag: `"v7"`},
		{Version: 3, Generation: 9, Claimed: 9, Length: rules.MaxPolicyBytes, Chunks: MaxChunks, ETag: strings.Repeat("e", MaxETagBytes)},
		{Claimed: 3}, // generations claimed, nothing published yet
	} {
		got, ok := DecodeMeta(AppendMeta(nil, m))
		if !ok || got != m {
			t.Errorf("DecodeMeta(AppendMeta(%+v)) = %+v, %v", m, got, ok)
		}
	}
	// The meta key as created: nothing claimed, nothing published.
	if got, ok := DecodeMeta(nil); !ok || got != (Meta{}) || got.Published() {
		t.Errorf("DecodeMeta(empty) = %+v, %v; want the zero Meta", got, ok)
	}
	// An ETag over the bound is dropped, not truncated.
	m := Meta{Version: 1, Generation: 1, Claimed: 1, ETag: strings.Repeat("e", MaxETagBytes+1)}
	if got, ok := DecodeMeta(AppendMeta(nil, m)); !ok || got.ETag != "" {
		t.Errorf("long ETag: got %+v, %v; want it encoded as empty", got, ok)
	}
}

func TestDecodeMetaMalformed(t *testing.T) {
	good := AppendMeta(nil, Meta{Version: 1, Generation: 1, Claimed: 1, Length: ChunkBytes + 1, Chunks: 2, ETag: `"v1"`})
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"short", good[:metaFixedBytes-1]},
		{"bad magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"trailing byte", append(append([]byte(nil), good...), 0)},
		{"etag cut", good[:len(good)-1]},
		{"generation 0 with a version", AppendMeta(nil, Meta{Version: 1, Generation: 0, Claimed: 1})},
		{"generation 0 with a length", AppendMeta(nil, Meta{Length: 1, Chunks: 1})},
		{"claimed below generation", AppendMeta(nil, Meta{Version: 1, Generation: 2, Claimed: 1})},
		{"chunk count wrong", AppendMeta(nil, Meta{Version: 1, Generation: 1, Claimed: 1, Length: ChunkBytes + 1, Chunks: 1})},
		{"too long", AppendMeta(nil, Meta{Version: 1, Generation: 1, Claimed: 1, Length: rules.MaxPolicyBytes + 1, Chunks: MaxChunks + 1})},
		{"etag length over bound", mutate(func(b []byte) []byte {
			b[44], b[45] = 0xff, 0xff
			return b
		})},
	} {
		if m, ok := DecodeMeta(tc.b); ok {
			t.Errorf("%s: DecodeMeta accepted %+v", tc.name, m)
		}
	}
}

func TestChunksAssemble(t *testing.T) {
	for _, n := range []int{0, 1, ChunkBytes - 1, ChunkBytes, ChunkBytes + 1, 3*ChunkBytes + 17, rules.MaxPolicyBytes} {
		doc := make([]byte, n)
		for i := range doc {
			doc[i] = byte(i * 7)
		}
		m := Meta{Version: 1, Generation: 5, Length: uint32(n), Chunks: chunkCount(n), Checksum: Checksum(doc)}
		cs := Chunks(doc, m.Generation)
		if len(cs) != int(m.Chunks) {
			t.Fatalf("%d bytes: %d chunks, want %d", n, len(cs), m.Chunks)
		}
		a := NewAssembler(m)
		for i, c := range cs {
			if !a.Add(i, c) {
				t.Fatalf("%d bytes: chunk %d refused", n, i)
			}
		}
		got, ok := a.Document()
		if !ok || !bytes.Equal(got, doc) {
			t.Errorf("%d bytes: Document() = %d bytes, %v", n, len(got), ok)
		}
	}
}

func TestAssemblerRejects(t *testing.T) {
	doc := bytes.Repeat([]byte("x"), 2*ChunkBytes+10)
	m := Meta{Version: 1, Generation: 4, Length: uint32(len(doc)), Chunks: 3, Checksum: Checksum(doc)}
	cs := Chunks(doc, m.Generation)
	other := Chunks(doc, m.Generation+2) // same slot, later generation
	corrupt := append([]byte(nil), cs[1]...)
	corrupt[20] ^= 1

	for _, tc := range []struct {
		name   string
		chunks [][]byte
		order  []int
		addOK  bool // whether every Add succeeds
	}{
		{"torn: chunk of a later generation", [][]byte{cs[0], other[1], cs[2]}, []int{0, 1, 2}, false},
		{"out of order", [][]byte{cs[1], cs[0], cs[2]}, []int{1, 0, 2}, false},
		{"short middle chunk", [][]byte{cs[0], cs[1][:100], cs[2]}, []int{0, 1, 2}, false},
		{"long last chunk", [][]byte{cs[0], cs[1], append(append([]byte(nil), cs[2]...), 'y')}, []int{0, 1, 2}, false},
		{"no header", [][]byte{cs[0], {1, 2}, cs[2]}, []int{0, 1, 2}, false},
		{"extra chunk", [][]byte{cs[0], cs[1], cs[2], cs[2]}, []int{0, 1, 2, 3}, false},
		{"missing chunk", [][]byte{cs[0], cs[1]}, []int{0, 1}, true},
		{"corrupted byte", [][]byte{cs[0], corrupt, cs[2]}, []int{0, 1, 2}, true},
	} {
		a := NewAssembler(m)
		allOK := true
		for j, c := range tc.chunks {
			if !a.Add(tc.order[j], c) {
				allOK = false
				break
			}
		}
		if allOK != tc.addOK {
			t.Errorf("%s: every Add succeeded = %v, want %v", tc.name, allOK, tc.addOK)
		}
		if _, ok := a.Document(); ok {
			t.Errorf("%s: Document() accepted", tc.name)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to every decoder of shared-data values;
// none may panic, and whatever decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(AppendMeta(nil, Meta{Version: 1, Generation: 1, Claimed: 2, Length: 3, Chunks: 1, ETag: `"v1"`}))
	f.Add(AppendLease(nil, Lease{Holder: 9, ExpiryNanos: 10}))
	f.Add(append(make([]byte, 8), "abc"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, ok := DecodeMeta(b); ok && len(b) > 0 && !bytes.Equal(AppendMeta(nil, m), b) {
			t.Errorf("meta %+v does not re-encode to its input", m)
		}
		if l, ok := DecodeLease(b); ok && !bytes.Equal(AppendLease(nil, l), b) {
			t.Errorf("lease %+v does not re-encode to its input", l)
		}
		m := Meta{Generation: 0, Length: uint32(len(b)) % 100, Chunks: 1}
		a := NewAssembler(m)
		a.Add(0, b)
		a.Document()
	})
}
