package host

import "context"

// MemorySize returns the size in bytes of the worker VM's linear memory
// (wasm memory.size × 64 KiB), read on the VM's loop; 0 if the VM is
// closed. Wasm memory only grows (golang/go#59061), so this is also
// the VM's peak: the filter's benchmarks use it to show that memory stops
// growing after warm-up.
//
// It is a read-only accessor (filter/memory_test.go uses it) and changes
// nothing in the VM.
func (w *Worker) MemorySize() uint32 {
	var n uint32
	_ = w.v.run(context.Background(), func() error {
		if w.v.mem != nil {
			n = w.v.mem.Size()
		}
		return nil
	})
	return n
}
