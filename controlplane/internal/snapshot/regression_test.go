package snapshot

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/redisstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// TestOtherEpochReplacesUnlessOlderRead: a record of another epoch replaces
// the one held, at any version, and is counted; an answer to a read sent
// before the record held (a lower ticket) does not bring the old epoch back.
func TestOtherEpochReplacesUnlessOlderRead(t *testing.T) {
	s, _ := newSnap(t)
	stale := s.Ticket()
	s.Apply(store.Record{Name: "p", Version: 3, Doc: []byte(`{"a":3}`), Epoch: "aaaa"})
	s.Apply(store.Record{Name: "p", Version: 1, Doc: []byte(`{"b":1}`), Epoch: "bbbb"})
	if r, _ := s.Get("p"); r.Version != 1 || r.Epoch != "bbbb" || s.Regressions() != 1 {
		t.Fatalf("after a new epoch: %+v, regressions %d", r, s.Regressions())
	}
	s.ApplyRead(store.Record{Name: "p", Version: 3, Doc: []byte(`{"a":3}`), Epoch: "aaaa"}, stale)
	if r, _ := s.Get("p"); r.Epoch != "bbbb" {
		t.Fatalf("a late answer brought the lost epoch back: %+v", r)
	}
	// Same epoch: only higher versions, whatever the ticket.
	s.ApplyRead(store.Record{Name: "p", Version: 2, Doc: []byte(`{"b":2}`), Epoch: "bbbb"}, stale)
	s.Apply(store.Record{Name: "p", Version: 1, Doc: []byte(`{"b":1}`), Epoch: "bbbb"})
	if r, _ := s.Get("p"); r.Version != 2 || s.Regressions() != 1 {
		t.Fatalf("same epoch: %+v, regressions %d", r, s.Regressions())
	}
	// A policy written before epochs gets one with its next commit: no alarm.
	s.Apply(store.Record{Name: "old", Version: 4, Doc: []byte(`{}`)})
	s.Apply(store.Record{Name: "old", Version: 5, Doc: []byte(`{"x":1}`), Epoch: "cccc"})
	if r, _ := s.Get("old"); r.Version != 5 || s.Regressions() != 1 {
		t.Fatalf("legacy record: %+v, regressions %d", r, s.Regressions())
	}
}

// TestStaleReplicaPromotedGetsNewEpoch: Redis goes back to an older state
// of a policy with the same epoch (as a replica that missed the last write
// would, once promoted). The resync proves the loss, serves the store's
// document and gives the policy a new epoch, so its lower version is not
// mistaken for a replica that is behind.
func TestStaleReplicaPromotedGetsNewEpoch(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	st, err := redisstore.Open(redisstore.Options{URL: srv.URL(), HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ResyncInterval: time.Hour})
	ctx := context.Background()
	var v2 store.Record
	for base := uint64(0); base < 3; base++ {
		r, err := st.Commit(ctx, store.Change{Name: "p", Base: base, Doc: []byte(`{"v":` + string(rune('1'+base)) + `}`), Op: store.OpPutPolicy, Time: time.Now(), ID: t.Name() + string(rune('a'+base))})
		if err != nil {
			t.Fatal(err)
		}
		if base == 1 {
			v2 = r
		}
	}
	if err := s.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	held, _ := s.Get("p")
	if held.Version != 3 {
		t.Fatalf("held %+v", held)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	if err := c.MSet(ctx, "sluice:policy:{p}:doc", string(v2.Doc), "sluice:policy:{p}:version", "2").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get("p")
	if got.Version != 2 || string(got.Doc) != string(v2.Doc) || got.Epoch == held.Epoch || got.Epoch == "" {
		t.Fatalf("after the regression the view holds %+v (was %+v), want version 2 in a new epoch", got, held)
	}
	if s.Regressions() != 1 {
		t.Fatalf("regressions %d, want 1", s.Regressions())
	}
	if r, _ := st.Get(ctx, "p"); r.Epoch != got.Epoch {
		t.Fatalf("the store's epoch %q, the view's %q", r.Epoch, got.Epoch)
	}
	// A next write continues in the new epoch and is served.
	r, err := st.Commit(ctx, store.Change{Name: "p", Base: 2, Doc: []byte(`{"v":"new3"}`), Op: store.OpPutPolicy, Time: time.Now(), ID: "n3"})
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(r)
	if got, _ := s.Get("p"); got.Version != 3 || string(got.Doc) != `{"v":"new3"}` || s.Regressions() != 1 {
		t.Fatalf("after the next write: %+v, regressions %d", got, s.Regressions())
	}
}

// TestSameVersionOtherDocumentRotates: a commit result with the version and
// epoch held but another document (a loss nobody saw, then a write of the
// same number) replaces the held record and gets the policy a new epoch.
func TestSameVersionOtherDocumentRotates(t *testing.T) {
	s, st := newSnap(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := commit(t, st, "p", 0, []byte(`{"v":1}`))
	s.Apply(store.Record{Name: "p", Version: 1, Doc: []byte(`{"lost":1}`), Epoch: r.Epoch})
	s.Apply(r)
	if got, _ := s.Get("p"); string(got.Doc) != `{"v":1}` || s.Regressions() != 1 {
		t.Fatalf("held %+v, regressions %d", got, s.Regressions())
	}
	go s.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := s.Get("p")
		if got.Epoch != r.Epoch && got.Epoch != "" && string(got.Doc) == `{"v":1}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy never got a new epoch: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
