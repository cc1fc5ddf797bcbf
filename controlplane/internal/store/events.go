package store

import (
	"context"
	"sync"
)

// Fanout delivers events to subscribers without ever blocking the sender:
// each subscriber has a coalescing set of pending changes (the latest event
// per name) drained by its own goroutine, so a slow subscriber loses no name,
// only intermediate versions. Store implementations embed it.
type Fanout struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	mu      sync.Mutex
	pending map[string]Event
	resync  bool
	signal  chan struct{}
}

// Subscribe registers a subscriber until ctx is done; the first event is a
// resync event.
func (f *Fanout) Subscribe(ctx context.Context) <-chan Event {
	s := &subscriber{pending: make(map[string]Event), resync: true, signal: make(chan struct{}, 1)}
	s.signal <- struct{}{}
	f.mu.Lock()
	if f.subs == nil {
		f.subs = make(map[*subscriber]struct{})
	}
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	out := make(chan Event)
	go func() {
		defer close(out)
		defer func() {
			f.mu.Lock()
			delete(f.subs, s)
			f.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.signal:
			}
			for _, e := range s.drain() {
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

func (s *subscriber) drain() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []Event
	if s.resync {
		evs = append(evs, Event{})
		s.resync = false
	}
	for _, e := range s.pending {
		evs = append(evs, e)
	}
	clear(s.pending)
	return evs
}

// Publish queues e for every subscriber; an empty Name queues a resync. Of
// the events of one name not yet delivered, the highest version is kept, or
// the last one whose epoch differs.
func (f *Fanout) Publish(e Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.mu.Lock()
		if e.Name == "" {
			s.resync = true
		} else if p, ok := s.pending[e.Name]; !ok || e.Version > p.Version || e.Epoch != p.Epoch {
			// A new epoch replaces the pending event even at a lower version.
			s.pending[e.Name] = e
		}
		s.mu.Unlock()
		select {
		case s.signal <- struct{}{}:
		default:
		}
	}
}
