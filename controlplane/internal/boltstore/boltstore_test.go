package boltstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(Options{Dir: t.TempDir(), HistoryDepth: storetest.Depth})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestDurableAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(Options{Dir: dir, HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	c := store.Change{Name: "p", Base: 0, Doc: []byte(`{"version":1}`), Op: store.OpPutPolicy, Actor: "admin", Time: time.Now(), ID: "a"}
	if _, err := s.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.Base, c.Doc, c.ID = 1, []byte(`{"version":2}`), "b"
	before, err := s.Commit(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Options{Dir: dir, HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Get(ctx, "p")
	if err != nil || r.Version != 2 || string(r.Doc) != `{"version":2}` || r.Epoch != before.Epoch {
		t.Fatalf("after reopen Get = %+v, %v; want version 2 in epoch %q (stable per file)", r, err, before.Epoch)
	}
	h, _ := s.History(ctx, "p")
	if len(h) != 2 || h[1].Version != 1 {
		t.Fatalf("after reopen History = %+v", h)
	}
}

func TestSecondOpenFailsWhileLocked(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, HistoryDepth: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Open(Options{Dir: dir, HistoryDepth: 1, LockTimeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("second Open succeeded while the file is locked")
	}
}
