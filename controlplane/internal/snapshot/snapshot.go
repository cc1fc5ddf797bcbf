// Package snapshot keeps the control plane's in-memory view of the store:
// the latest record of every policy, from which reads and long polls are
// served, and the watch hub that wakes long polls when a policy changes.
//
// The view is fed by local commits (Apply), by the store's change events
// (Redis pub/sub: writes made through other replicas) and by a periodic
// resync that re-reads every version, the safety net for lost notices. A
// resync also runs whenever the store's subscription is (re)established.
//
// # Store regressions
//
// A store may lose acknowledged writes (see store "Epochs"); its versions then
// go back, or start again in a new epoch. The view never keeps serving what
// the store lost:
//
//   - A record of another epoch replaces the one held, whatever its version,
//     unless it comes from a read older than the one held (every read takes a
//     Ticket before it is sent; a late answer from before the change is
//     dropped).
//   - A resync that lists a lower version in the same epoch, or no longer
//     lists a policy, re-reads it: a read sent after the view had the higher
//     version and still answering lower proves the loss. A policy the store
//     no longer has is dropped from the view (404); one that went back within
//     its epoch gets a new epoch (store.Rotate), so that every replica and
//     every filter learns the lower versions are newer.
//   - With Options.RestoreLost, a policy the store no longer has at all is
//     not dropped but written back: the last document this view served is
//     committed as version 1 of a new history (store.OpRestore, Base 0), so
//     proxies and the quota service recover with no human. Only one writer
//     wins that commit; a replica that loses the race (or finds an
//     operator's write there first) adopts what the store holds. Until the
//     write succeeds the view keeps serving the document it held.
//   - A record with the version and epoch held but another document (a loss
//     nobody noticed, then a new write of the same number) replaces it and
//     the policy gets a new epoch too.
//
// Each of these is logged at error level and counted (Regressions).
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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/watch"
	"github.com/sluice-proxy/sluice/shared/rules"
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
	// RestoreLost makes the view write back a policy the store lost (see
	// "Store regressions"); false drops it from the view (404).
	RestoreLost bool
	// Now is the clock for the history entry of a restore; nil means
	// time.Now.
	Now func() time.Time
}

// Snapshot is the in-memory view. It is safe for concurrent use.
type Snapshot struct {
	st       store.Store
	log      *slog.Logger
	interval time.Duration
	hub      *watch.Hub
	restore  bool
	now      func() time.Time

	mu   sync.RWMutex
	recs map[string]held // every name seen with Version > 0, tombstones included

	seq         atomic.Uint64     // last Ticket
	gen         atomic.Uint64     // changes applied (Generation)
	rotate      chan store.Record // records whose epoch Run must rotate
	regressions atomic.Uint64
	restores    atomic.Uint64

	healthy atomic.Bool
	loaded  atomic.Bool
	errors  atomic.Uint64
}

// held is a record of the view and the ticket of the read that produced it.
type held struct {
	rec    store.Record
	ticket uint64
}

// New returns an empty view; call Run to fill it and keep it fresh.
func New(o Options) *Snapshot {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Snapshot{st: o.Store, log: o.Logger, interval: o.ResyncInterval, hub: watch.New(),
		restore: o.RestoreLost, now: o.Now,
		recs: make(map[string]held), rotate: make(chan store.Record, 16)}
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
			if cur, _ := s.Get(ev.Name); cur.Version < ev.Version || ev.Epoch != "" && ev.Epoch != cur.Epoch {
				if _, err := s.Load(ctx, ev.Name); err != nil {
					s.log.Warn("snapshot: load after change notice failed", "policy", ev.Name, "version", ev.Version, "err", err)
				}
			}
		case r := <-s.rotate:
			s.rotateEpoch(ctx, r)
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
		cur, _ := s.Get(r.Name)
		switch {
		case cur.Version < r.Version || cur.Epoch != r.Epoch || !cur.Exists():
			if _, err := s.Load(ctx, r.Name); err != nil {
				return err
			}
		case cur.Version > r.Version:
			if err := s.check(ctx, cur); err != nil {
				return err
			}
		}
	}
	s.mu.RLock()
	var gone []store.Record
	for _, h := range s.recs {
		if h.rec.Exists() && !live[h.rec.Name] {
			gone = append(gone, h.rec)
		}
	}
	s.mu.RUnlock()
	for _, cur := range gone {
		if err := s.check(ctx, cur); err != nil {
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
	t := s.Ticket()
	r, err := s.st.Get(ctx, name)
	if err != nil {
		s.fail(err)
		return store.Record{}, err
	}
	s.ApplyRead(r, t)
	return r, nil
}

// check re-reads cur's policy, which the store listed lower than cur or no
// longer listed, and acts on a proven loss (see "Store regressions"): the
// read is sent after cur was in the view, so it answers at least cur's
// version unless the store lost it.
func (s *Snapshot) check(ctx context.Context, cur store.Record) error {
	t := s.Ticket()
	r, err := s.st.Get(ctx, cur.Name)
	if err != nil {
		s.fail(err)
		return err
	}
	switch {
	case r.Version == 0 && cur.Version > 0 && s.restore && cur.Exists():
		s.mu.RLock()
		h, ok := s.recs[cur.Name]
		s.mu.RUnlock()
		if ok && h.ticket < t {
			return s.restoreLost(ctx, h.rec)
		}
	case r.Version == 0 && cur.Version > 0:
		s.mu.Lock()
		h, ok := s.recs[cur.Name]
		drop := ok && h.ticket < t
		if drop {
			delete(s.recs, cur.Name)
		}
		s.mu.Unlock()
		if drop {
			s.regressed(cur, r, "the store no longer has the policy; it is no longer served")
			s.hub.Notify(cur.Name)
		}
	case r.Epoch == cur.Epoch && r.Version < cur.Version:
		s.regressed(cur, r, "the store's version went back within its epoch; giving the policy a new epoch")
		s.rotateEpoch(ctx, r)
	default:
		s.ApplyRead(r, t)
	}
	return nil
}

// restoreLost writes was, the last document the view served of a policy
// the store no longer has, back as version 1 (see "Store regressions"). On a
// conflict (another replica restored it, or an operator wrote it) it adopts
// the store's record; on a store error it keeps was in the view and the next
// resync tries again.
func (s *Snapshot) restoreLost(ctx context.Context, was store.Record) error {
	p, err := rules.ParsePolicy(was.Doc)
	if err != nil {
		// A document this view served always parses; if it ever does not,
		// drop it as without RestoreLost rather than write it back.
		s.log.Error("snapshot: the lost policy does not parse; not restoring it", "policy", was.Name, "err", err)
		s.mu.Lock()
		delete(s.recs, was.Name)
		s.mu.Unlock()
		s.regressed(was, store.Record{Name: was.Name}, "the store no longer has the policy; it is no longer served")
		s.hub.Notify(was.Name)
		return nil
	}
	p.Version = 1
	t := s.Ticket()
	nr, err := s.st.Commit(ctx, store.Change{Name: was.Name, Base: 0, Doc: rules.EncodePolicy(p), Op: store.OpRestore,
		Actor: restoreActor, Detail: "restored version " + strconv.FormatUint(was.Version, 10) + " of epoch " + was.Epoch + " after the store lost it",
		Time: s.now().UTC(), ID: "restore-" + store.NewEpoch()})
	switch {
	case err == nil:
		s.regressions.Add(1)
		s.restores.Add(1)
		s.log.Error("snapshot: STORE LOST ACKNOWLEDGED WRITES: the store no longer has the policy; wrote the last version served back as a new version",
			"policy", was.Name, "was_version", was.Version, "was_epoch", was.Epoch, "version", nr.Version, "epoch", nr.Epoch)
		s.applyRead(nr, t, false)
		return nil
	case errors.Is(err, store.ErrConflict):
		// Someone wrote the policy first: serve what the store holds.
		r, err := s.st.Get(ctx, was.Name)
		if err != nil {
			s.fail(err)
			return err
		}
		s.log.Warn("snapshot: the store lost the policy and another writer wrote it back first; serving the store's",
			"policy", was.Name, "was_version", was.Version, "version", r.Version, "epoch", r.Epoch)
		if r.Version == 0 {
			return nil // deleted meanwhile and lost again: the next resync looks again
		}
		s.applyRead(r, t, false)
		return nil
	default:
		s.fail(err)
		return err
	}
}

// restoreActor is the history actor of a restore.
const restoreActor = "sluice-controlplane"

// rotateEpoch gives r's policy a new epoch in the store (if it still has
// r's) and applies the result.
func (s *Snapshot) rotateEpoch(ctx context.Context, r store.Record) {
	t := s.Ticket()
	nr, err := s.st.Rotate(ctx, r.Name, r.Epoch)
	if err != nil {
		s.fail(err)
		s.log.Error("snapshot: could not give the policy a new epoch after a store regression; retrying on the next resync",
			"policy", r.Name, "epoch", r.Epoch, "err", err)
		return
	}
	s.log.Warn("snapshot: policy has a new epoch", "policy", nr.Name, "version", nr.Version, "epoch", nr.Epoch, "was", r.Epoch)
	s.applyRead(nr, t, false)
}

// regressed logs and counts a loss of acknowledged writes.
func (s *Snapshot) regressed(was, now store.Record, what string) {
	s.regressions.Add(1)
	s.log.Error("snapshot: STORE LOST ACKNOWLEDGED WRITES: "+what,
		"policy", was.Name, "version", now.Version, "epoch", now.Epoch,
		"was_version", was.Version, "was_epoch", was.Epoch)
}

// Ticket returns a number larger than every earlier one. Take it before a
// store read or commit and pass it to ApplyRead with the result, so a late
// answer from before an epoch change cannot replace a newer one.
func (s *Snapshot) Ticket() uint64 { return s.seq.Add(1) }

// Apply is ApplyRead with a ticket taken now: for records that are known to
// be current (such as a commit's result).
func (s *Snapshot) Apply(r store.Record) { s.ApplyRead(r, s.Ticket()) }

// ApplyRead records r, the result of a store read or commit sent after
// ticket was taken, if it is newer than what the view holds, and wakes the
// watchers of its name. Newer means: a higher version in the same epoch;
// another epoch from a later read; or the same version and epoch with
// another document from a later read (a loss: the epoch is then rotated).
// Records of names never written (Version 0) are not kept, so the view does
// not grow with lookups of unknown names.
func (s *Snapshot) ApplyRead(r store.Record, ticket uint64) { s.applyRead(r, ticket, true) }

func (s *Snapshot) applyRead(r store.Record, ticket uint64, count bool) {
	if r.Version == 0 {
		return
	}
	if r.Sum == "" {
		r.Sum = r.DocSum()
	}
	s.mu.Lock()
	cur, ok := s.recs[r.Name]
	var regression, rotate bool
	switch {
	case !ok:
	case r.Epoch == cur.rec.Epoch && r.Version > cur.rec.Version:
		ticket = max(ticket, cur.ticket)
	case ticket < cur.ticket:
		s.mu.Unlock()
		return // an answer from before the record held
	case r.Epoch != cur.rec.Epoch:
		// Records written before epochs get one with their next commit.
		regression = cur.rec.Epoch != "" || r.Version <= cur.rec.Version
	case r.Version == cur.rec.Version && r.Sum != cur.rec.Sum:
		regression, rotate = true, true
	default:
		s.mu.Unlock()
		return
	}
	s.recs[r.Name] = held{rec: r, ticket: ticket}
	s.gen.Add(1)
	s.mu.Unlock()
	if regression && count {
		s.regressed(cur.rec, r, "the store serves other documents under versions already served; now serving the store's")
	}
	if rotate {
		select {
		case s.rotate <- r:
		default: // full: the next resync's notices and reads catch up
		}
	}
	s.hub.Notify(r.Name)
}

// Get returns the view's record of name and whether the view has one.
func (s *Snapshot) Get(name string) (store.Record, bool) {
	s.mu.RLock()
	h, ok := s.recs[name]
	s.mu.RUnlock()
	r := h.rec
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

// Generation counts the changes the view has applied: a caller that derived
// something from List need not derive it again while Generation is unchanged.
// It only grows.
func (s *Snapshot) Generation() uint64 { return s.gen.Load() }

// List returns the live policies of the view (Doc included), sorted by name.
func (s *Snapshot) List() []store.Record {
	s.mu.RLock()
	out := make([]store.Record, 0, len(s.recs))
	for _, h := range s.recs {
		if h.rec.Exists() {
			out = append(out, h.rec)
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

// Restores returns how many lost policies this view wrote back to the store
// (Options.RestoreLost).
func (s *Snapshot) Restores() uint64 { return s.restores.Load() }

// Regressions returns how many times the view found that the store had lost
// acknowledged writes of a policy (see "Store regressions").
func (s *Snapshot) Regressions() uint64 { return s.regressions.Load() }
