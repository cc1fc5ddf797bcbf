//go:build !wasip1

package proxywasm

import (
	"testing"
	"unsafe"
)

// resetArena drops the slab so that a test sees the arena from scratch, and
// again when it ends.
func resetArena(t *testing.T) {
	t.Helper()
	reset := func() { EndHostScratch(); arenaSlab = nil; lastAlloc = nil }
	reset()
	t.Cleanup(reset)
}

// hostValue reads one header through a fixedHost answering v, as the
// binding does: allocate, copy, takeAlloc.
func hostValue(t *testing.T, v string) []byte {
	t.Helper()
	host = &fixedHost{value: []byte(v)}
	defer func() { host = unimplementedHost{} }()
	b, st := hostGetHeaderMapValue(MapTypeHttpRequestHeaders, "k")
	if st != statusOK || string(b) != v {
		t.Fatalf("read %q, %d; want %q", b, st, v)
	}
	return b
}

func TestScratchReusedAcrossScopes(t *testing.T) {
	resetArena(t)
	BeginHostScratch()
	a1, a2 := hostValue(t, "first"), hostValue(t, "second")
	EndHostScratch()
	BeginHostScratch()
	b1, b2 := hostValue(t, "third"), hostValue(t, "4th")
	EndHostScratch()
	if unsafe.SliceData(a1) != unsafe.SliceData(b1) || unsafe.SliceData(a2) != unsafe.SliceData(b2) {
		t.Fatalf("second scope got %p, %p; want the first scope's %p, %p", b1, b2, a1, a2)
	}
	if string(a1) != "third" {
		t.Fatalf("reused buffer holds %q", a1)
	}
	if d := uintptr(unsafe.Pointer(unsafe.SliceData(a2))) - uintptr(unsafe.Pointer(unsafe.SliceData(a1))); d != arenaAlign {
		t.Fatalf("second buffer %d bytes after the first, want %d (8-byte aligned offsets)", d, arenaAlign)
	}
	if cap(a1) != len(a1) {
		t.Fatalf("arena buffer cap %d > len %d: appending would overwrite its neighbour", cap(a1), len(a1))
	}
}

func TestScratchNeverOverwritesUnscopedBuffers(t *testing.T) {
	resetArena(t)
	outside := hostValue(t, "kept")
	for range 3 {
		BeginHostScratch()
		for range 100 {
			b := hostValue(t, "clobber")
			if unsafe.SliceData(b) == unsafe.SliceData(outside) {
				t.Fatal("scope handed out the unscoped buffer")
			}
		}
		EndHostScratch()
	}
	if string(outside) != "kept" {
		t.Fatalf("unscoped buffer now holds %q", outside)
	}
	// A buffer read after a scope ended is fresh too.
	BeginHostScratch()
	inside := hostValue(t, "in")
	EndHostScratch()
	after := hostValue(t, "after")
	if unsafe.SliceData(after) == unsafe.SliceData(inside) {
		t.Fatal("read after EndHostScratch got an arena buffer")
	}
}

func TestScratchBeginIsIdempotent(t *testing.T) {
	resetArena(t)
	BeginHostScratch()
	a := hostValue(t, "aaaa")
	BeginHostScratch() // no reset
	b := hostValue(t, "bbbb")
	if unsafe.SliceData(a) == unsafe.SliceData(b) || string(a) != "aaaa" {
		t.Fatalf("second Begin reset the scope: a=%q", a)
	}
	EndHostScratch()
	EndHostScratch() // outside a scope: nothing
	if arenaOpen || arenaOff != 0 {
		t.Fatalf("after End: open %v, offset %d", arenaOpen, arenaOff)
	}
}

func TestScratchGrowthAndCap(t *testing.T) {
	resetArena(t)
	BeginHostScratch()
	// Fill well past the first slab: it doubles, and earlier buffers keep
	// their content.
	var bufs [][]byte
	for i := range 100 {
		v := string(rune('a'+i%26)) + string(make([]byte, 999))
		bufs = append(bufs, hostValue(t, v))
	}
	for i, b := range bufs {
		if b[0] != byte('a'+i%26) || len(b) != 1000 {
			t.Fatalf("buffer %d overwritten: %q...", i, b[:1])
		}
	}
	if n := len(arenaSlab); n <= arenaMinBytes || n > arenaMaxBytes {
		t.Fatalf("slab %d bytes after 100 KB in one scope; want (4 KiB, 256 KiB]", n)
	}
	// A result above the cap is a fresh buffer and leaves the slab alone.
	slab := unsafe.SliceData(arenaSlab)
	big := hostValue(t, string(make([]byte, arenaMaxBytes+1)))
	if unsafe.SliceData(arenaSlab) != slab || len(arenaSlab) > arenaMaxBytes {
		t.Fatal("a result above the cap replaced the slab")
	}
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(big))); p >= uintptr(unsafe.Pointer(slab)) && p < uintptr(unsafe.Pointer(slab))+uintptr(len(arenaSlab)) {
		t.Fatal("a result above the cap came from the slab")
	}
	EndHostScratch()
	// Past the cap within one scope: the slab stops at the cap, the rest
	// are fresh buffers, and nothing is overwritten.
	BeginHostScratch()
	bufs = bufs[:0]
	for i := range 600 { // 600 KB
		bufs = append(bufs, hostValue(t, string(rune('a'+i%26))+string(make([]byte, 999))))
	}
	if len(arenaSlab) != arenaMaxBytes {
		t.Fatalf("slab %d bytes, want the cap %d", len(arenaSlab), arenaMaxBytes)
	}
	for i, b := range bufs {
		if b[0] != byte('a'+i%26) {
			t.Fatalf("buffer %d overwritten", i)
		}
	}
	EndHostScratch()
}

func TestTakeAllocChecksArenaBuffers(t *testing.T) {
	resetArena(t)
	BeginHostScratch()
	defer EndHostScratch()
	p := allocate(4)
	if _, st := takeAlloc(statusOK, uint32(uintptr(p))+8, 4); st != statusInvalidMemoryAccess {
		t.Fatalf("neighbouring arena address accepted: %d", st)
	}
	p = allocate(4)
	if _, st := takeAlloc(statusOK, uint32(uintptr(p)), 5); st != statusInvalidMemoryAccess {
		t.Fatalf("size beyond the arena buffer accepted: %d", st)
	}
	p = allocate(4)
	if b, st := takeAlloc(statusOK, uint32(uintptr(p)), 4); st != statusOK || unsafe.Pointer(&b[0]) != p {
		t.Fatalf("arena buffer not claimed: %d", st)
	}
}
