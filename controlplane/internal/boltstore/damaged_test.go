package boltstore

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// fill writes n policies with a few versions each and closes the store.
func fill(t *testing.T, dir string, n int) {
	t.Helper()
	s, err := Open(Options{Dir: dir, HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		name := "p" + strconv.Itoa(i)
		for v := uint64(0); v < 3; v++ {
			doc := []byte(`{"policy":"` + name + `","version":` + strconv.FormatUint(v+1, 10) + `,"rules":[]}` + strings.Repeat(" ", 300))
			if _, err := s.Commit(ctx, store.Change{Name: name, Base: v, Doc: doc, Op: store.OpPutPolicy, Actor: "t", Time: time.Now(), ID: name + strconv.FormatUint(v, 10)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyStoreFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir, HistoryDepth: 5})
	if err == nil {
		s.Close()
		t.Fatal("Open accepted an empty store file as a new store")
	}
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("Open(empty file) = %v; want ErrDamaged naming %s and saying it is empty", err, path)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("the empty file was written to (%d bytes)", fi.Size())
	}
}

func TestNewStoreIsCreatedWhereNoneExists(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	s, err := Open(Options{Dir: dir, HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// damage rewrites the store file in dir.
type damage struct {
	name string
	fn   func(b []byte) []byte
}

var damages = []damage{
	{"truncated to half", func(b []byte) []byte { return b[:len(b)/2] }},
	{"truncated to one page", func(b []byte) []byte { return b[:4096] }},
	{"garbage", func(b []byte) []byte {
		g := make([]byte, len(b))
		rand.New(rand.NewSource(1)).Read(g)
		return g
	}},
	{"garbage after the meta pages", func(b []byte) []byte {
		g := bytes.Clone(b)
		rand.New(rand.NewSource(2)).Read(g[2*4096:])
		return g
	}},
	{"zeroed after the meta pages", func(b []byte) []byte {
		g := bytes.Clone(b)
		clear(g[2*4096:])
		return g
	}},
}

func TestDamagedStoreFileIsAnError(t *testing.T) {
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			dir := t.TempDir()
			fill(t, dir, 40)
			path := filepath.Join(dir, FileName)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, d.fn(b), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(Options{Dir: dir, HistoryDepth: 5})
			if err == nil {
				s.Close()
				t.Fatal("Open accepted a damaged store file")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open(damaged) = %v; want ErrDamaged naming %s", err, path)
			}
		})
	}
}

// TestStoreDamagedWhileOpenIsAnError: a file damaged under a running store
// makes its operations fail with an error, not a panic, so that the control
// plane keeps serving its snapshot.
func TestStoreDamagedWhileOpenIsAnError(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 40)
	s, err := Open(Options{Dir: dir, HistoryDepth: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	g := make([]byte, fi.Size()-2*4096)
	rand.New(rand.NewSource(3)).Read(g)
	if _, err := f.WriteAt(g, 2*4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ctx := context.Background()
	if _, err := s.List(ctx); err == nil || !errors.Is(err, ErrDamaged) {
		t.Fatalf("List on a damaged file = %v, want ErrDamaged", err)
	}
	for i := 0; i < 40; i++ {
		name := "p" + strconv.Itoa(i)
		if _, err := s.Get(ctx, name); err != nil && !errors.Is(err, ErrDamaged) {
			t.Fatalf("Get = %v", err)
		}
		if _, err := s.History(ctx, name); err != nil && !errors.Is(err, ErrDamaged) {
			t.Fatalf("History = %v", err)
		}
	}
}

func TestSecondOpenNamesTheLock(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, HistoryDepth: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(Options{Dir: dir, HistoryDepth: 1, LockTimeout: 50 * time.Millisecond})
	if err == nil || !errors.Is(err, berrors.ErrTimeout) || !strings.Contains(err.Error(), "another process") ||
		!strings.Contains(err.Error(), filepath.Join(dir, FileName)) {
		t.Fatalf("second Open = %v; want a lock error naming the file and the other process", err)
	}
}

func TestResetDamagedStoreMovesItAside(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 5)
	path := filepath.Join(dir, FileName)
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir, HistoryDepth: 5, ResetDamaged: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if l, err := s.List(context.Background()); err != nil || len(l) != 0 {
		t.Fatalf("List after reset = %v, %v; want empty", l, err)
	}
	if s.MovedAside() == "" {
		t.Fatal("MovedAside is empty after a reset")
	}
	kept, err := os.ReadFile(s.MovedAside())
	if err != nil || !bytes.Equal(kept, b[:len(b)/2]) {
		t.Fatalf("the damaged file was not kept at %s: %v", s.MovedAside(), err)
	}

	// A valid store is never reset.
	dir2 := t.TempDir()
	fill(t, dir2, 3)
	s2, err := Open(Options{Dir: dir2, HistoryDepth: 5, ResetDamaged: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if l, _ := s2.List(context.Background()); len(l) != 3 || s2.MovedAside() != "" {
		t.Fatalf("a valid store was reset: %d policies, moved aside %q", len(l), s2.MovedAside())
	}
}

// fileSize returns the size of the store file in dir.
func fileSize(t *testing.T, dir string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestDeletedPoliciesAreReclaimed: creating and deleting policies does not
// make the file grow without bound; the pages of deleted policies' documents
// and histories are freed and reused.
func TestDeletedPoliciesAreReclaimed(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, HistoryDepth: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	doc := []byte(`{"rules":[]}` + strings.Repeat(" ", 2000))
	churn := func(round, n int) {
		for i := 0; i < n; i++ {
			name := "r" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
			r, err := s.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			c := store.Change{Name: name, Base: r.Version, Doc: doc, Op: store.OpPutPolicy, Actor: "t", Time: time.Now(), ID: "a"}
			r, err = s.Commit(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			c.Base, c.ID = r.Version, "b"
			r, err = s.Commit(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			c.Base, c.Doc, c.Op, c.ID = r.Version, nil, store.OpDeletePolicy, "c"
			if _, err := s.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	churn(0, 100)
	after := fileSize(t, dir)
	for round := 1; round <= 5; round++ {
		churn(round, 100)
	}
	grown := fileSize(t, dir)
	// 500 more deleted policies: only their tombstones (name, version,
	// write id, deletion entry: a few hundred bytes each) may remain.
	t.Logf("file size after 100 created and deleted policies: %d bytes; after 600: %d bytes", after, grown)
	if grown-after > 1<<20 {
		t.Fatalf("file grew from %d to %d bytes over 500 created and deleted policies", after, grown)
	}
	// The same names again: nothing new is kept.
	sz := fileSize(t, dir)
	for k := 0; k < 3; k++ {
		churn(1, 100)
	}
	if again := fileSize(t, dir); again > sz+64<<10 {
		t.Fatalf("re-using names grew the file from %d to %d bytes", sz, again)
	}
	h, err := s.History(ctx, "r1-0")
	if err != nil || len(h) != 1 || h[0].Op != store.OpDeletePolicy || h[0].Doc != nil {
		t.Fatalf("history of a deleted policy = %+v, %v; want only its deletion", h, err)
	}
}
