// Package snapshot keeps the control plane's in-memory view of the store:
// the latest record of every policy, from which reads and long polls are
// served, and the watch hub that wakes long polls when a policy changes.
//
// The view is fed by local commits (Apply), by the store's change events
// (Redis pub/sub: writes made through other replicas) and by a periodic
// resync that re-reads every version, the safety net for lost notices. A
// resync also runs whenever the store's subscription is (re)established.
//
// # Failure policy
//
// When the store is unreachable the view keeps its last contents, so reads
// and long polls go on being served; Healthy turns false until a resync
// succeeds again, which happens by itself on the next tick.
package snapshot

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/watch"
)

// Options configure New.
type Options struct {
	// Store is the backing store.
	Store store.Store
	// Logger receives resync and event problems; nil means slog.Default().
	Logger *slog.Logger
	// ResyncInterval is how often every version is re-read and the store
	// pinged; 0 means 2 seconds.
	ResyncInterval time.Duration
}

// Snapshot is the in-memory view. It is safe for concurrent use.
type Snapshot struct {
	st       store.Store
	log      *slog.Logger
	interval time.Duration
	hub      *watch.Hub

	mu   sync.RWMutex
	recs map[string]store.Record // every name seen with Version > 0, tombstones included

	healthy atomic.Bool
	loaded  atomic.Bool
	errors  atomic.Uint64
}

// New returns an empty view; call Run to fill it and keep it fresh.
func New(o Options) *Snapshot {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 2 * time.Second
	}
	return &Snapshot{st: o.Store, log: o.Logger, interval: o.ResyncInterval, hub: watch.New(), recs: make(map[string]store.Record)}
}

// Run keeps the view fresh until ctx is done: it consumes the store's events
// and resyncs on every resync event and every ResyncInterval.
func (s *Snapshot) Run(ctx context.Context) {
	events := s.st.Subscribe(ctx)
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Name == "" {
				s.Resync(ctx)
				continue
			}
			if cur, _ := s.Get(ev.Name); cur.Version < ev.Version {
				if _, err := s.Load(ctx, ev.Name); err != nil {
					s.log.Warn("snapshot: load after change notice failed", "policy", ev.Name, "version", ev.Version, "err", err)
				}
			}
		case <-tick.C:
			s.Resync(ctx)
		}
	}
}

// Resync re-reads every version from the store and loads the documents that
// changed, including policies deleted meanwhile. It reports the store's
// health through Healthy.
func (s *Snapshot) Resync(ctx context.Context) error {
	list, err := s.st.List(ctx)
	if err != nil {
		s.fail(err)
		return err
	}
	live := make(map[string]bool, len(list))
	for _, r := range list {
		live[r.Name] = true
		if cur, _ := s.Get(r.Name); cur.Version < r.Version || !cur.Exists() {
			if _, err := s.Load(ctx, r.Name); err != nil {
				return err
			}
		}
	}
	s.mu.RLock()
	var gone []string
	for name, r := range s.recs {
		if r.Exists() && !live[name] {
			gone = append(gone, name)
		}
	}
	s.mu.RUnlock()
	for _, name := range gone {
		if _, err := s.Load(ctx, name); err != nil {
			return err
		}
	}
	if !s.healthy.Swap(true) {
		s.log.Info("snapshot: store reachable, view in sync", "policies", len(list))
	}
	s.loaded.Store(true)
	return nil
}

func (s *Snapshot) fail(err error) {
	if errors.Is(err, context.Canceled) {
		return // the caller gave up (client gone, shutdown): nothing about the store
	}
	s.errors.Add(1)
	if s.healthy.Swap(false) {
		s.log.Error("snapshot: store unreachable; serving the last snapshot", "err", err)
	}
}

// ReportError marks the store unhealthy after a failed operation (such as a
// commit); the next successful resync clears it.
func (s *Snapshot) ReportError(err error) { s.fail(err) }

// Load reads name from the store, applies it to the view and returns it.
func (s *Snapshot) Load(ctx context.Context, name string) (store.Record, error) {
	r, err := s.st.Get(ctx, name)
	if err != nil {
		s.fail(err)
		return store.Record{}, err
	}
	s.Apply(r)
	return r, nil
}

// Apply records r if it is newer than what the view holds and wakes the
// watchers of its name. Records of names never written (Version 0) are not
// kept, so the view does not grow with lookups of unknown names.
func (s *Snapshot) Apply(r store.Record) {
	if r.Version == 0 {
		return
	}
	s.mu.Lock()
	cur, ok := s.recs[r.Name]
	if ok && cur.Version >= r.Version {
		s.mu.Unlock()
		return
	}
	s.recs[r.Name] = r
	s.mu.Unlock()
	s.hub.Notify(r.Name)
}

// Get returns the view's record of name and whether the view has one.
func (s *Snapshot) Get(name string) (store.Record, bool) {
	s.mu.RLock()
	r, ok := s.recs[name]
	s.mu.RUnlock()
	if !ok {
		r.Name = name
	}
	return r, ok
}

// Watch registers interest in name, then returns the view's record of it
// (as Get), a channel closed at the next change of name, and a release
// function the caller must call when done. Registering first means no change
// after the returned record can be missed.
func (s *Snapshot) Watch(name string) (r store.Record, ok bool, changed <-chan struct{}, release func()) {
	changed, release = s.hub.Watch(name)
	r, ok = s.Get(name)
	return r, ok, changed, release
}

// List returns the live policies of the view (Doc included), sorted by name.
func (s *Snapshot) List() []store.Record {
	s.mu.RLock()
	out := make([]store.Record, 0, len(s.recs))
	for _, r := range s.recs {
		if r.Exists() {
			out = append(out, r)
		}
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Healthy reports whether the last contact with the store succeeded.
func (s *Snapshot) Healthy() bool { return s.healthy.Load() }

// Loaded reports whether a full resync ever succeeded, so that a name
// missing from the view can be taken as not existing.
func (s *Snapshot) Loaded() bool { return s.loaded.Load() }

// StoreErrors returns how many store operations the view saw fail.
func (s *Snapshot) StoreErrors() uint64 { return s.errors.Load() }
