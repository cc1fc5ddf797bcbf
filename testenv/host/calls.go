package host

import "sync/atomic"

// importCounters counts hostcalls by import name. The map is filled while
// the Host's import modules are defined, before any VM runs, and only
// read afterwards; each defined function holds its own counter, so a call
// costs one atomic add and no lookup.
type importCounters map[string]*atomic.Uint64

// counter returns name's counter, creating it: the WASI functions are
// defined twice (wasi_snapshot_preview1 and wasi_unstable) and share one.
func (c importCounters) counter(name string) *atomic.Uint64 {
	n := c[name]
	if n == nil {
		n = new(atomic.Uint64)
		c[name] = n
	}
	return n
}

// ImportCalls returns how many times the guest called each import since
// the Host started or since the last ResetImportCalls, summed over every
// VM of the Host (the canary included), keyed by the import's name
// without its module: "proxy_get_header_map_value", "proxy_set_property",
// "clock_time_get", "random_get", … (the names of the proxy-wasm ABI
// v0.2.1 spec and of WASI wasi_snapshot_preview1; a WASI call through the
// wasi_unstable module counts under the same name). Imports never called
// are absent. The WASI functions this host leaves to wazero (those Envoy
// does not define, which fail for lack of a filesystem) are not counted.
//
// Counts taken while VMs are running are a snapshot: each counter is read
// atomically, but not all at one instant.
func (h *Host) ImportCalls() map[string]uint64 {
	out := make(map[string]uint64)
	for name, n := range h.calls {
		if c := n.Load(); c > 0 {
			out[name] = c
		}
	}
	return out
}

// ResetImportCalls sets every count ImportCalls and CallbackCalls report to
// zero. Calls made concurrently, on VMs still running, may or may not be
// counted.
func (h *Host) ResetImportCalls() {
	for _, n := range h.calls {
		n.Store(0)
	}
	for _, n := range h.entries {
		n.Store(0)
	}
}

// CallbackCalls returns how many times the host entered the module through
// each exported callback ("proxy_on_request_headers", "proxy_on_tick", …)
// since the Host started or since the last ResetImportCalls, summed over
// every VM including the canary. The allocator the host calls to place
// data in guest memory (malloc or proxy_on_memory_allocate) is not counted.
// An event whose callback the module does
// not export is answered as proxy-wasm-cpp-host answers it (Continue, or
// nothing) without entering the module, and is not counted. Snapshot
// semantics as ImportCalls.
func (h *Host) CallbackCalls() map[string]uint64 {
	out := make(map[string]uint64)
	for name, n := range h.entries {
		if name == h.allocName {
			continue
		}
		if c := n.Load(); c > 0 {
			out[name] = c
		}
	}
	return out
}

// AllocatorCalls returns how many times the host entered the module's
// allocator (malloc, else proxy_on_memory_allocate, as proxy-wasm-cpp-host
// chooses) to place a hostcall's result in guest memory, since the Host
// started or since the last ResetImportCalls, summed over every VM. Each is
// an entry into the module like a callback, made from inside a hostcall.
func (h *Host) AllocatorCalls() uint64 {
	if n := h.entries[h.allocName]; n != nil {
		return n.Load()
	}
	return 0
}
