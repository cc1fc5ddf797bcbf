// Package watch is the in-process broadcaster that wakes long polls: one
// channel per watched key, closed and replaced each time the key changes, so
// any number of waiters block on a single channel and a change wakes them all
// with one close. Entries exist only while someone waits on them, so memory
// is bounded by the number of open waits, not by the keys ever asked for.
package watch

import "sync"

// Hub broadcasts changes by key. The zero value is not usable; call New.
type Hub struct {
	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	ch      chan struct{}
	waiters int
}

// New returns an empty Hub.
func New() *Hub {
	return &Hub{entries: make(map[string]*entry)}
}

// Watch registers interest in key and returns a channel that is closed at the
// next Notify(key), and a release function the caller must call once it stops
// waiting. Callers that must not miss a change register before reading the
// state they compare against.
func (h *Hub) Watch(key string) (changed <-chan struct{}, release func()) {
	h.mu.Lock()
	e := h.entries[key]
	if e == nil {
		e = &entry{ch: make(chan struct{})}
		h.entries[key] = e
	}
	e.waiters++
	h.mu.Unlock()
	var once sync.Once
	return e.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			e.waiters--
			if e.waiters == 0 && h.entries[key] == e {
				delete(h.entries, key)
			}
			h.mu.Unlock()
		})
	}
}

// Notify wakes everyone waiting on key.
func (h *Hub) Notify(key string) {
	h.mu.Lock()
	if e := h.entries[key]; e != nil {
		close(e.ch)
		// Waiters still holding e release it; new waiters get a fresh entry.
		delete(h.entries, key)
	}
	h.mu.Unlock()
}

// Waiting returns the number of keys with at least one waiter.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}
