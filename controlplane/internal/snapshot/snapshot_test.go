package snapshot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/boltstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

func newSnap(t *testing.T) (*Snapshot, store.Store) {
	t.Helper()
	st, err := boltstore.Open(boltstore.Options{Dir: t.TempDir(), HistoryDepth: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ResyncInterval: 20 * time.Millisecond}), st
}

func commit(t *testing.T, st store.Store, name string, base uint64, doc []byte) store.Record {
	t.Helper()
	r, err := st.Commit(context.Background(), store.Change{Name: name, Base: base, Doc: doc, Op: store.OpPutPolicy, Time: time.Now(), ID: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestApplyIsMonotonicAndWakes(t *testing.T) {
	s, _ := newSnap(t)
	r, ok, changed, release := s.Watch("p")
	defer release()
	if ok || r.Version != 0 || r.Name != "p" {
		t.Fatalf("Watch(unknown) = %+v %v", r, ok)
	}
	s.Apply(store.Record{Name: "p", Version: 2, Doc: []byte(`{}`)})
	select {
	case <-changed:
	default:
		t.Fatal("Apply did not wake the watcher")
	}
	s.Apply(store.Record{Name: "p", Version: 1, Doc: []byte(`{"old":1}`)})
	if r, _ := s.Get("p"); r.Version != 2 {
		t.Fatalf("older record replaced a newer one: %+v", r)
	}
	s.Apply(store.Record{Name: "never", Version: 0})
	if _, ok := s.Get("never"); ok {
		t.Fatal("a never-written name was kept")
	}
}

func TestRunFollowsTheStore(t *testing.T) {
	s, st := newSnap(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	_, _, changed, release := s.Watch("p")
	defer release()
	commit(t, st, "p", 0, []byte(`{"v":1}`)) // written behind the snapshot's back
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot never saw the commit")
	}
	if r, _ := s.Get("p"); r.Version != 1 || !s.Healthy() {
		t.Fatalf("Get = %+v, healthy %v", r, s.Healthy())
	}
	// A deletion is picked up by the resync too.
	if _, err := st.Commit(ctx, store.Change{Name: "p", Base: 1, Op: store.OpDeletePolicy, Time: time.Now(), ID: "d"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, _ := s.Get("p"); !r.Exists() && r.Version == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deletion never seen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(s.List()) != 0 {
		t.Fatalf("List after delete = %+v", s.List())
	}
}

func TestUnhealthyWhenStoreFails(t *testing.T) {
	s, st := newSnap(t)
	if err := s.Resync(context.Background()); err != nil || !s.Healthy() || !s.Loaded() {
		t.Fatalf("Resync: %v healthy %v loaded %v", err, s.Healthy(), s.Loaded())
	}
	st.Close()
	if err := s.Resync(context.Background()); err == nil || s.Healthy() || s.StoreErrors() == 0 {
		t.Fatalf("Resync on a closed store: %v healthy %v errors %d", err, s.Healthy(), s.StoreErrors())
	}
}

// ctxStore is a store whose Get honours its context, as the Redis store does.
type ctxStore struct{ store.Store }

func (c ctxStore) Get(ctx context.Context, name string) (store.Record, error) {
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	return c.Store.Get(ctx, name)
}

// TestCanceledRequestKeepsHealthy: a store call cut short because the
// client went away (context canceled) says nothing about the store, so it
// must not turn readiness false or count as a store error.
func TestCanceledRequestKeepsHealthy(t *testing.T) {
	_, st := newSnap(t)
	s := New(Options{Store: ctxStore{st}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.Resync(context.Background()); err != nil || !s.Healthy() {
		t.Fatalf("Resync: %v healthy %v", err, s.Healthy())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Load(ctx, "p"); err == nil {
		t.Fatal("Load with a canceled context succeeded")
	}
	s.ReportError(fmt.Errorf("redisstore: commit p: %w", context.Canceled))
	if !s.Healthy() || s.StoreErrors() != 0 {
		t.Fatalf("after canceled calls: healthy %v, store errors %d", s.Healthy(), s.StoreErrors())
	}
}
