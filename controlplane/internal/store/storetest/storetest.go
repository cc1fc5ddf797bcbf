// Package storetest is the conformance suite every store.Store passes: one
// function, Run, that takes a constructor and checks the contract documented
// in package store (versions, compare-and-set, tombstones, capped history,
// idempotent retries, events, epochs).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// Depth is the history depth the constructor must configure.
const Depth = 3

// Factory returns a fresh, empty store with history depth Depth. The store is
// closed by the suite (closing twice must be harmless).
type Factory func(t *testing.T) store.Store

// doc is a stand-in document: stores treat documents as opaque bytes.
func doc(name string, v uint64) []byte {
	return []byte(fmt.Sprintf(`{"policy":%q,"version":%d}`, name, v))
}

func change(name string, base uint64, op store.Operation) store.Change {
	return store.Change{
		Name: name, Base: base, Doc: doc(name, base+1), Op: op, Actor: "admin:test",
		Time: time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC), ID: fmt.Sprintf("%s-%d-%d", name, base, time.Now().UnixNano()),
	}
}

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"GetUnknown", testGetUnknown},
		{"CreateAndGet", testCreateAndGet},
		{"Conflict", testConflict},
		{"RetryIsIdempotent", testRetryIsIdempotent},
		{"DeleteLeavesTombstone", testDeleteLeavesTombstone},
		{"HistoryCapped", testHistoryCapped},
		{"ConcurrentWritersOneWins", testConcurrentWritersOneWins},
		{"Subscribe", testSubscribe},
		{"List", testList},
		{"Closed", testClosed},
		{"EpochStable", testEpochStable},
		{"Rotate", testRotate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			defer s.Close()
			tc.fn(t, s)
		})
	}
	t.Run("EpochDiffersAfterLoss", func(t *testing.T) { testEpochDiffersAfterLoss(t, newStore) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustCommit(t *testing.T, s store.Store, c store.Change) store.Record {
	t.Helper()
	r, err := s.Commit(ctx(t), c)
	if err != nil {
		t.Fatalf("Commit(%s base=%d): %v", c.Name, c.Base, err)
	}
	return r
}

func testGetUnknown(t *testing.T, s store.Store) {
	r, err := s.Get(ctx(t), "nope")
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != 0 || r.Doc != nil || r.Exists() {
		t.Fatalf("Get(unknown) = %+v, want version 0 and no doc", r)
	}
	h, err := s.History(ctx(t), "nope")
	if err != nil || len(h) != 0 {
		t.Fatalf("History(unknown) = %v, %v; want empty", h, err)
	}
	if err := s.Ping(ctx(t)); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func testCreateAndGet(t *testing.T, s store.Store) {
	r := mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	if r.Name != "p" || r.Version != 1 || string(r.Doc) != string(doc("p", 1)) {
		t.Fatalf("Commit = %+v", r)
	}
	got, err := s.Get(ctx(t), "p")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 || string(got.Doc) != string(doc("p", 1)) {
		t.Fatalf("Get = %+v, want version 1", got)
	}
	r = mustCommit(t, s, change("p", 1, store.OpAddRule))
	if r.Version != 2 {
		t.Fatalf("second commit version = %d, want 2", r.Version)
	}
}

func testConflict(t *testing.T, s store.Store) {
	mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	for _, base := range []uint64{0, 2, 7} {
		_, err := s.Commit(ctx(t), change("p", base, store.OpPutPolicy))
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("Commit(base=%d) err = %v, want ErrConflict", base, err)
		}
	}
	got, _ := s.Get(ctx(t), "p")
	if got.Version != 1 || string(got.Doc) != string(doc("p", 1)) {
		t.Fatalf("after conflicts Get = %+v, want version 1 unchanged", got)
	}
}

func testRetryIsIdempotent(t *testing.T, s store.Store) {
	c := change("p", 0, store.OpPutPolicy)
	mustCommit(t, s, c)
	r, err := s.Commit(ctx(t), c)
	if err != nil || r.Version != 1 {
		t.Fatalf("retried Commit = %+v, %v; want version 1, no error", r, err)
	}
	h, _ := s.History(ctx(t), "p")
	if len(h) != 1 {
		t.Fatalf("history after retry has %d entries, want 1", len(h))
	}
}

func testDeleteLeavesTombstone(t *testing.T, s store.Store) {
	mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	mustCommit(t, s, change("p", 1, store.OpPutPolicy))
	del := change("p", 2, store.OpDeletePolicy)
	del.Doc = nil
	r := mustCommit(t, s, del)
	if r.Version != 3 || r.Exists() {
		t.Fatalf("delete = %+v, want version 3 without doc", r)
	}
	got, _ := s.Get(ctx(t), "p")
	if got.Version != 3 || got.Exists() {
		t.Fatalf("Get after delete = %+v, want tombstone version 3", got)
	}
	list, _ := s.List(ctx(t))
	if len(list) != 0 {
		t.Fatalf("List after delete = %+v, want empty", list)
	}
	// Deleting frees the documents of the history: only the deletion stays.
	h, _ := s.History(ctx(t), "p")
	if len(h) != 1 || h[0].Op != store.OpDeletePolicy || h[0].Doc != nil || h[0].Version != 3 {
		t.Fatalf("History after delete = %+v, want only the deletion", h)
	}
	if again, err := s.Commit(ctx(t), del); err != nil || again.Version != 3 || again.Exists() {
		t.Fatalf("retried delete = %+v, %v; want the tombstone", again, err)
	}
	r = mustCommit(t, s, change("p", 3, store.OpPutPolicy))
	if r.Version != 4 || !r.Exists() {
		t.Fatalf("re-create = %+v, want version 4", r)
	}
	h, _ = s.History(ctx(t), "p")
	if len(h) != 2 || h[0].Version != 4 || h[0].Doc == nil || h[1].Op != store.OpDeletePolicy {
		t.Fatalf("History after re-create = %+v, want version 4 and the deletion", h)
	}
}

func testHistoryCapped(t *testing.T, s store.Store) {
	for base := uint64(0); base < 5; base++ {
		c := change("p", base, store.OpPutPolicy)
		c.Detail = fmt.Sprint("n", base)
		mustCommit(t, s, c)
	}
	h, err := s.History(ctx(t), "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != Depth {
		t.Fatalf("history has %d entries, want %d", len(h), Depth)
	}
	for i, e := range h {
		want := uint64(5 - i)
		if e.Version != want || string(e.Doc) != string(doc("p", want)) || e.Actor != "admin:test" ||
			e.Op != store.OpPutPolicy || e.Detail != fmt.Sprint("n", want-1) ||
			!e.Time.Equal(time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)) {
			t.Fatalf("history[%d] = %+v, want version %d", i, e, want)
		}
	}
}

func testConcurrentWritersOneWins(t *testing.T, s store.Store) {
	mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, conflicts := 0, 0
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := change("p", 1, store.OpPutPolicy)
			c.ID = fmt.Sprint("writer-", i)
			_, err := s.Commit(context.Background(), c)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, store.ErrConflict):
				conflicts++
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	if wins != 1 || conflicts != n-1 {
		t.Fatalf("wins=%d conflicts=%d, want 1 and %d", wins, conflicts, n-1)
	}
}

func testSubscribe(t *testing.T, s store.Store) {
	c, cancel := context.WithCancel(ctx(t))
	events := s.Subscribe(c)
	next := func() store.Event {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("event channel closed early")
			}
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10s")
		}
		return store.Event{}
	}
	if e := next(); e.Name != "" {
		t.Fatalf("first event = %+v, want a resync event", e)
	}
	mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	e := next()
	for e.Name == "" { // more resync events are allowed (e.g. on (re)subscription)
		e = next()
	}
	got, _ := s.Get(ctx(t), "p")
	if e.Name != "p" || e.Version != 1 || e.Epoch != got.Epoch {
		t.Fatalf("event = %+v, want p@1 in epoch %q", e, got.Epoch)
	}
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("event channel not closed after cancel")
		}
	}
}

func testList(t *testing.T, s store.Store) {
	mustCommit(t, s, change("b", 0, store.OpPutPolicy))
	mustCommit(t, s, change("a", 0, store.OpPutPolicy))
	mustCommit(t, s, change("a", 1, store.OpPutPolicy))
	list, err := s.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "a" || list[0].Version != 2 || list[1].Name != "b" || list[1].Version != 1 {
		t.Fatalf("List = %+v, want a@2, b@1", list)
	}
}

func testClosed(t *testing.T, s store.Store) {
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx(t), "p"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close err = %v, want ErrClosed", err)
	}
	if _, err := s.Commit(ctx(t), change("p", 0, store.OpPutPolicy)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Commit after Close err = %v, want ErrClosed", err)
	}
}

// validEpoch reports whether e looks like store.NewEpoch's output.
func validEpoch(e string) bool {
	if len(e) != 16 {
		return false
	}
	for _, c := range e {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// testEpochStable: a written record has an epoch, the same from every
// method and across commits and deletion; a name never written has none;
// records carry their document's Sum.
func testEpochStable(t *testing.T, s store.Store) {
	if r, _ := s.Get(ctx(t), "p"); r.Epoch != "" {
		t.Fatalf("Get(never written).Epoch = %q, want empty", r.Epoch)
	}
	r1 := mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	if !validEpoch(r1.Epoch) {
		t.Fatalf("Commit epoch %q, want 16 hex digits", r1.Epoch)
	}
	if r1.Sum != store.Sum(r1.Doc) {
		t.Fatalf("Commit Sum %q, want %q", r1.Sum, store.Sum(r1.Doc))
	}
	got, _ := s.Get(ctx(t), "p")
	if got.Epoch != r1.Epoch || got.Sum != store.Sum(doc("p", 1)) {
		t.Fatalf("Get = %+v, want epoch %q and the document's Sum", got, r1.Epoch)
	}
	r2 := mustCommit(t, s, change("p", 1, store.OpPutPolicy))
	if r2.Epoch != r1.Epoch {
		t.Fatalf("second commit epoch %q, want %q", r2.Epoch, r1.Epoch)
	}
	list, _ := s.List(ctx(t))
	if len(list) != 1 || list[0].Epoch != r1.Epoch {
		t.Fatalf("List = %+v, want epoch %q", list, r1.Epoch)
	}
	del := change("p", 2, store.OpDeletePolicy)
	del.Doc = nil
	if r := mustCommit(t, s, del); r.Epoch != r1.Epoch || r.Sum != "" {
		t.Fatalf("delete = %+v, want epoch %q and no Sum", r, r1.Epoch)
	}
	if got, _ := s.Get(ctx(t), "p"); got.Epoch != r1.Epoch {
		t.Fatalf("tombstone epoch %q, want %q", got.Epoch, r1.Epoch)
	}
	// A retried commit reports the epoch too.
	c := change("q", 0, store.OpPutPolicy)
	q := mustCommit(t, s, c)
	if again := mustCommit(t, s, c); again.Epoch != q.Epoch || !validEpoch(q.Epoch) {
		t.Fatalf("retried commit epoch %q, first %q", again.Epoch, q.Epoch)
	}
}

// testRotate: Rotate from the current epoch draws a new one and keeps
// version, document and history; from another epoch it changes nothing.
func testRotate(t *testing.T, s store.Store) {
	mustCommit(t, s, change("p", 0, store.OpPutPolicy))
	r := mustCommit(t, s, change("p", 1, store.OpPutPolicy))
	same, err := s.Rotate(ctx(t), "p", "0123456789abcdef")
	if err != nil || same.Epoch != r.Epoch || same.Version != 2 {
		t.Fatalf("Rotate(stale epoch) = %+v, %v; want epoch %q unchanged", same, err, r.Epoch)
	}
	rot, err := s.Rotate(ctx(t), "p", r.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if rot.Epoch == r.Epoch || !validEpoch(rot.Epoch) || rot.Version != 2 || string(rot.Doc) != string(r.Doc) || rot.Sum != r.Sum {
		t.Fatalf("Rotate = %+v, want version 2, the same document and a new epoch (was %q)", rot, r.Epoch)
	}
	if got, _ := s.Get(ctx(t), "p"); got.Epoch != rot.Epoch {
		t.Fatalf("Get after Rotate epoch %q, want %q", got.Epoch, rot.Epoch)
	}
	if again, _ := s.Rotate(ctx(t), "p", r.Epoch); again.Epoch != rot.Epoch {
		t.Fatalf("a second Rotate from the old epoch changed it again: %q", again.Epoch)
	}
	if h, _ := s.History(ctx(t), "p"); len(h) != 2 {
		t.Fatalf("history after Rotate has %d entries, want 2", len(h))
	}
	if next := mustCommit(t, s, change("p", 2, store.OpPutPolicy)); next.Epoch != rot.Epoch || next.Version != 3 {
		t.Fatalf("commit after Rotate = %+v, want version 3 in epoch %q", next, rot.Epoch)
	}
	if n, err := s.Rotate(ctx(t), "never", ""); err != nil || n.Version != 0 || n.Epoch != "" {
		t.Fatalf("Rotate(never written) = %+v, %v", n, err)
	}
}

// testEpochDiffersAfterLoss: a store that lost everything (for Redis the
// factory flushes the data of the first; for the embedded store it is a
// new file) hands out version 1 again, in another epoch.
func testEpochDiffersAfterLoss(t *testing.T, newStore Factory) {
	s1 := newStore(t)
	defer s1.Close()
	r1 := mustCommit(t, s1, change("p", 0, store.OpPutPolicy))
	s2 := newStore(t)
	defer s2.Close()
	r2 := mustCommit(t, s2, change("p", 0, store.OpPutPolicy))
	if r2.Version != 1 || r2.Epoch == r1.Epoch || !validEpoch(r2.Epoch) {
		t.Fatalf("after the loss version %d epoch %q; before, epoch %q: want version 1 in a new epoch", r2.Version, r2.Epoch, r1.Epoch)
	}
}
