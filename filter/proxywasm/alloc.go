package proxywasm

import "unsafe"

// lastAlloc is the buffer most recently handed to the host by
// proxy_on_memory_allocate and not yet claimed by a hostcall wrapper. It
// keeps the buffer reachable for the garbage collector between the moment
// the host obtains it and the moment the wrapper takes it over, so the
// wrapper never has to turn a 32-bit address written by the host back into
// a Go pointer.
var lastAlloc []byte

// allocate implements proxy_on_memory_allocate (spec v0.2.1 "Memory
// management"): a GC-managed buffer of size bytes. Size 0 is answered with
// a valid 1-byte buffer rather than a panic; hosts never ask for it (they
// write ptr=0,size=0 instead, proxy-wasm-cpp-host WasmBase::copyToPointerSize).
func allocate(size uint32) (p unsafe.Pointer) {
	defer catchPanic("proxy_on_memory_allocate")
	n := size
	if n == 0 {
		n = 1
	}
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
