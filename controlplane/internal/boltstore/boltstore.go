// Package boltstore is the embedded, single-node store.Store: one bbolt file
// in a data directory, durable across restarts (bbolt fsyncs every commit
// before it returns). It is the default when no Redis URL is configured.
//
// # File layout
//
// The file is <dir>/sluice.db. Its root bucket "policies" holds one bucket
// per policy name with the keys
//
//	version   8-byte big-endian version counter (survives deletion)
//	doc       canonical policy JSON; absent for a deleted policy
//	write_id  the Change.ID of the last commit (makes retries idempotent)
//	history   a bucket: 8-byte big-endian version -> store.MarshalEntry JSON,
//	          trimmed to the configured depth
//
// The root bucket "meta" holds
//
//	epoch     the file's epoch (store.NewEpoch), drawn when the file is
//	          created (or first opened by a version that has epochs)
//
// Every record of the file carries that epoch: bbolt fsyncs each commit, so
// the file's versions never go back while it lives. A copy restored from an
// older backup does go back under the same epoch, which nothing here can
// tell from a file that was never newer; Rotate draws a new epoch.
//
// Only one process may open the file; a second one fails after Options.LockTimeout.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// Options configure Open.
type Options struct {
	// Dir is the data directory; it is created (mode 0700) if missing.
	Dir string
	// HistoryDepth is how many history entries are kept per policy (≥ 1).
	HistoryDepth int
	// LockTimeout bounds the wait for the file lock held by another process;
	// 0 means 5 seconds.
	LockTimeout time.Duration
}

var (
	bucketPolicies = []byte("policies")
	bucketMeta     = []byte("meta")
	keyEpoch       = []byte("epoch")
	bucketHistory  = []byte("history")
	keyVersion     = []byte("version")
	keyDoc         = []byte("doc")
	keyWriteID     = []byte("write_id")
)

// Store is the bbolt-backed store.Store.
type Store struct {
	db     *bolt.DB
	depth  int
	closed atomic.Bool
	store.Fanout
}

var _ store.Store = (*Store)(nil)

// Open opens (or creates) the store in o.Dir.
func Open(o Options) (*Store, error) {
	if o.HistoryDepth < 1 {
		return nil, fmt.Errorf("boltstore: history depth %d, want ≥ 1", o.HistoryDepth)
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = 5 * time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: create data dir: %w", err)
	}
	path := filepath.Join(o.Dir, "sluice.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.LockTimeout})
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketPolicies); err != nil {
			return err
		}
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if len(m.Get(keyEpoch)) == 0 {
			return m.Put(keyEpoch, []byte(store.NewEpoch()))
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: init %s: %w", path, err)
	}
	return &Store{db: db, depth: o.HistoryDepth}, nil
}

// epoch returns the file's epoch as of tx.
func epoch(tx *bolt.Tx) string {
	if m := tx.Bucket(bucketMeta); m != nil {
		return string(m.Get(keyEpoch))
	}
	return ""
}

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func be(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return bytes.Clone(b)
}

// Get implements store.Store.
func (s *Store) Get(_ context.Context, name string) (store.Record, error) {
	if s.closed.Load() {
		return store.Record{}, store.ErrClosed
	}
	r := store.Record{Name: name}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil {
			return nil
		}
		r.Version = u64(b.Get(keyVersion))
		r.Doc = clone(b.Get(keyDoc))
		r.Sum = store.Sum(r.Doc)
		if r.Version > 0 {
			r.Epoch = epoch(tx)
		}
		return nil
	})
	return r, err
}

// List implements store.Store.
func (s *Store) List(_ context.Context) ([]store.Record, error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	var out []store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		e := epoch(tx)
		return tx.Bucket(bucketPolicies).ForEachBucket(func(k []byte) error {
			b := tx.Bucket(bucketPolicies).Bucket(k)
			if b.Get(keyDoc) != nil {
				out = append(out, store.Record{Name: string(k), Version: u64(b.Get(keyVersion)), Epoch: e})
			}
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// Commit implements store.Store.
func (s *Store) Commit(_ context.Context, c store.Change) (store.Record, error) {
	if s.closed.Load() {
		return store.Record{}, store.ErrClosed
	}
	r := store.Record{Name: c.Name}
	err := s.db.Update(func(tx *bolt.Tx) error {
		r.Epoch = epoch(tx)
		b, err := tx.Bucket(bucketPolicies).CreateBucketIfNotExists([]byte(c.Name))
		if err != nil {
			return err
		}
		cur := u64(b.Get(keyVersion))
		if cur != c.Base {
			if c.ID != "" && cur == c.Base+1 && string(b.Get(keyWriteID)) == c.ID {
				r.Version, r.Doc = cur, clone(b.Get(keyDoc))
				return nil
			}
			return store.ErrConflict
		}
		next := cur + 1
		if err := b.Put(keyVersion, be(next)); err != nil {
			return err
		}
		if c.Doc == nil {
			err = b.Delete(keyDoc)
		} else {
			err = b.Put(keyDoc, c.Doc)
		}
		if err != nil {
			return err
		}
		if err := b.Put(keyWriteID, []byte(c.ID)); err != nil {
			return err
		}
		h, err := b.CreateBucketIfNotExists(bucketHistory)
		if err != nil {
			return err
		}
		if err := h.Put(be(next), store.MarshalEntry(store.EntryOf(c, next))); err != nil {
			return err
		}
		var drop [][]byte
		n, hc := 0, h.Cursor()
		for k, _ := hc.Last(); k != nil; k, _ = hc.Prev() {
			if n++; n > s.depth {
				drop = append(drop, bytes.Clone(k))
			}
		}
		for _, k := range drop {
			if err := h.Delete(k); err != nil {
				return err
			}
		}
		r.Version, r.Doc = next, clone(c.Doc)
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Record{}, err
		}
		return store.Record{}, fmt.Errorf("boltstore: commit %s: %w", c.Name, err)
	}
	r.Sum = store.Sum(r.Doc)
	s.Publish(store.Event{Name: c.Name, Version: r.Version, Epoch: r.Epoch})
	return r, nil
}

// Rotate implements store.Store: the file has one epoch, so a new one
// applies to every policy, and subscribers get a resync event.
func (s *Store) Rotate(ctx context.Context, name, from string) (store.Record, error) {
	if s.closed.Load() {
		return store.Record{}, store.ErrClosed
	}
	rotated := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil || u64(b.Get(keyVersion)) == 0 || epoch(tx) != from {
			return nil
		}
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		rotated = true
		return m.Put(keyEpoch, []byte(store.NewEpoch()))
	})
	if err != nil {
		return store.Record{}, fmt.Errorf("boltstore: rotate %s: %w", name, err)
	}
	if rotated {
		s.Publish(store.Event{})
	}
	return s.Get(ctx, name)
}

// History implements store.Store.
func (s *Store) History(_ context.Context, name string) ([]store.HistoryEntry, error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	var out []store.HistoryEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil || b.Bucket(bucketHistory) == nil {
			return nil
		}
		c := b.Bucket(bucketHistory).Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			e, err := store.UnmarshalEntry(v)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// Ping implements store.Store: the file is open.
func (s *Store) Ping(context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// Close implements store.Store. Closing twice is harmless.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.db.Close()
}
