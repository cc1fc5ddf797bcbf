package proxywasm

import "unsafe"

// lastAlloc is the buffer most recently handed to the host by
// proxy_on_memory_allocate and not yet claimed by a hostcall wrapper. It
// keeps the buffer reachable for the garbage collector between the moment
// the host obtains it and the moment the wrapper takes it over, so the
// wrapper never has to turn a 32-bit address written by the host back into
// a Go pointer.
var lastAlloc []byte

// The host-scratch arena (BeginHostScratch, EndHostScratch): one reused
// slab from which allocate serves requests while a scope is open.
var (
	// arenaSlab is the current slab; arenaOff is the first free byte.
	arenaSlab []byte
	arenaOff  int
	// arenaOpen is true between BeginHostScratch and EndHostScratch.
	arenaOpen bool
)

const (
	// arenaMinBytes is the size of the first slab.
	arenaMinBytes = 4 << 10
	// arenaMaxBytes caps the slab: it never grows beyond, and a request
	// the slab cannot serve is a fresh allocation.
	arenaMaxBytes = 256 << 10
	// arenaAlign is the alignment of every arena buffer, in bytes.
	arenaAlign = 8
)

// BeginHostScratch opens a host-scratch scope. Until EndHostScratch, every
// buffer the host obtains through proxy_on_memory_allocate (spec v0.2.1
// "Memory management") to return a result (header values and maps,
// properties, shared-data values, bodies, queue items, status messages) is
// carved from one reused slab instead of being a fresh heap allocation, so
// that reading host data allocates nothing once the slab has grown to what
// a callback needs (it doubles from 4 KiB up to 256 KiB; a result that does
// not fit falls back to a fresh allocation, and a result above 256 KiB
// always does).
//
// Lifetime contract: every string or []byte that this package returns
// inside the scope and that comes from the host (GetHttpRequestHeader,
// GetHttpRequestHeaders, GetProperty, GetSharedData, GetHttpCallResponseBody,
// ...) is valid only until EndHostScratch; after it the memory is reused
// and its content changes. Copy (string(b), strings.Clone) what must live
// longer. Results obtained outside a scope are fresh allocations owned by
// the caller forever, and a later scope never touches them.
//
// Open the scope in a callback; it ends at EndHostScratch or, at the
// latest, when the callback returns (the binding ends it then, so a
// callback need not defer EndHostScratch). Scopes do not nest:
// BeginHostScratch inside an open scope does nothing (the scope still ends
// at the first EndHostScratch).
func BeginHostScratch() { arenaOpen = true }

// EndHostScratch closes the scope opened by BeginHostScratch and makes every
// arena buffer handed out since then reusable: the caller promises that it
// holds no view of any host result obtained inside the scope. Outside a
// scope it does nothing. Every callback's return does the same. See
// BeginHostScratch.
func EndHostScratch() {
	arenaOpen = false
	arenaOff = 0
}

// arenaAlloc returns an n-byte buffer (n > 0) from the slab, or nil if the
// slab cannot serve it. When the rest of the slab is too small, the slab is
// replaced by one twice as large (up to arenaMaxBytes, and at least n); the
// buffers already handed out stay valid in the old slab, which the garbage
// collector frees once nobody views it.
func arenaAlloc(n uint32) []byte {
	if n > arenaMaxBytes {
		return nil
	}
	size := int(n+arenaAlign-1) &^ (arenaAlign - 1)
	if arenaOff+size > len(arenaSlab) {
		grown := 2 * len(arenaSlab)
		if grown < arenaMinBytes {
			grown = arenaMinBytes
		}
		for grown < size {
			grown *= 2
		}
		if grown > arenaMaxBytes {
			if len(arenaSlab) >= arenaMaxBytes {
				return nil // full slab at the cap: the caller allocates
			}
			grown = arenaMaxBytes
		}
		arenaSlab = make([]byte, grown)
		arenaOff = 0
	}
	buf := arenaSlab[arenaOff : arenaOff+int(n) : arenaOff+int(n)]
	arenaOff += size
	return buf
}

// allocate implements proxy_on_memory_allocate (spec v0.2.1 "Memory
// management"): inside a host-scratch scope an arena buffer (see
// BeginHostScratch), otherwise a GC-managed buffer of size bytes. Size 0 is
// answered with a valid 1-byte buffer rather than a panic; hosts never ask
// for it (they write ptr=0,size=0 instead, proxy-wasm-cpp-host
// WasmBase::copyToPointerSize). Arena buffers are not zeroed: the host
// overwrites all size bytes.
//
// The arena path cannot panic (arenaAlloc checks every bound before it
// slices, and running out of memory is a fatal error, not a panic), so
// only the heap path pays for the deferred panic guard: most of a warm
// request's allocations are arena ones, and the guard is two more Go calls
// (the deferred function and recover) on each.
func allocate(size uint32) unsafe.Pointer {
	if arenaOpen && size > 0 {
		if buf := arenaAlloc(size); buf != nil {
			lastAlloc = buf
			return unsafe.Pointer(&buf[0])
		}
	}
	return allocateHeap(size)
}

// allocateHeap is allocate's GC-managed buffer, behind the panic guard.
func allocateHeap(size uint32) (p unsafe.Pointer) {
	defer endAllocate()
	n := max(size, 1)
	buf := make([]byte, n)
	lastAlloc = buf[:size]
	return unsafe.Pointer(&buf[0])
}

// takeAlloc claims the buffer the host filled during the hostcall that just
// returned st, given the pointer and size (bytes) the host wrote back. Every
// proxy-wasm-cpp-host hostcall allocates at most once and writes the pointer
// back at once (proxy-wasm-cpp-host include/proxy-wasm/wasm.h
// WasmBase::copyToPointerSize; docs/ENVOY.md, Memory and the allocator), so
// the pointer must be that of lastAlloc; anything else is reported as
// INVALID_MEMORY_ACCESS.
func takeAlloc(st status, ptr, size uint32) ([]byte, status) {
	buf := lastAlloc
	lastAlloc = nil
	if st != statusOK {
		return nil, st
	}
	if size == 0 {
		return nil, statusOK
	}
	if buf == nil || uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) != ptr || uint32(len(buf)) < size {
		return nil, statusInvalidMemoryAccess
	}
	return buf[:size:size], statusOK
}

// bytesString views b as a string without copying. Only for buffers this
// package owns and never writes again (host results from takeAlloc).
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// endAllocate, deferred by allocate, stops a panic at the export boundary
// as endCallback does; it leaves the host-scratch scope alone (allocate runs
// inside a hostcall of a callback whose scope is open).
func endAllocate() {
	if r := recover(); r != nil {
		logPanic("proxy_on_memory_allocate", r)
	}
}
