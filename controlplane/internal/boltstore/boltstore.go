// Package boltstore is the embedded, single-node store.Store: one bbolt file
// in a data directory, durable across restarts (bbolt fsyncs every commit
// before it returns). It is the default when no Redis URL is configured.
//
// # File layout
//
// The file is <dir>/sluice.db ([FileName]). Its root bucket "policies" holds
// one bucket per policy name with the keys
//
//	version   8-byte big-endian version counter (survives deletion)
//	doc       canonical policy JSON; absent for a deleted policy
//	write_id  the Change.ID of the last commit (makes retries idempotent)
//	history   a bucket: 8-byte big-endian version -> store.MarshalEntry JSON,
//	          trimmed to the configured depth; absent for a deleted policy
//	deleted   store.MarshalEntry JSON of the deletion; only for a deleted policy
//	          (moved into the new history when the name is re-created)
//
// Deleting a policy drops its document and its history bucket, so their
// pages go back to bbolt's freelist and are reused by later writes (a bbolt
// file never shrinks, but it stops growing). What stays is a tombstone of a
// few hundred bytes, stored inline in the parent page: the version counter
// (so a re-created name never reuses an ETag), the write id and who deleted
// it when.
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
// # Failure policy
//
// Open creates a store only where no file exists. An existing file that is
// not a valid store (empty, truncated, garbage, a failed copy) is refused
// with [ErrDamaged] naming the file, unless Options.ResetDamaged moves it
// aside first. Open walks every page of an existing file and runs bbolt's
// consistency check, so that damage is found at start rather than as a
// panic later. Damage found while running (a page that does not decode)
// makes the operation fail with [ErrDamaged] instead of panicking.
//
// Only one process may open the file; a second one fails after
// Options.LockTimeout with an error that says so and wraps bberrors.ErrTimeout.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

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
	// ResetDamaged makes Open move an existing file that is not a valid store
	// aside (renamed to sluice.db.damaged-<UTC time>, never deleted) and
	// start with an empty store; see Store.MovedAside. A valid store is never
	// touched.
	ResetDamaged bool
}

// FileName is the name of the store file in Options.Dir.
const FileName = "sluice.db"

// ErrDamaged is wrapped by the errors of Open for an existing file that is
// not a valid store, and of every operation that finds the open file
// damaged. The message names the file.
var ErrDamaged = errors.New("boltstore: the store file is damaged")

var (
	bucketPolicies = []byte("policies")
	bucketMeta     = []byte("meta")
	keyEpoch       = []byte("epoch")
	bucketHistory  = []byte("history")
	keyVersion     = []byte("version")
	keyDoc         = []byte("doc")
	keyWriteID     = []byte("write_id")
	keyDeleted     = []byte("deleted")
)

// Store is the bbolt-backed store.Store.
type Store struct {
	db     *bolt.DB
	path   string
	moved  string
	depth  int
	closed atomic.Bool
	store.Fanout
}

var _ store.Store = (*Store)(nil)

// Open opens the store in o.Dir, creating the directory (mode 0700) and an
// empty store only if no store file exists there. Errors name the file:
// ErrDamaged for an existing file that is not a valid store (see
// Options.ResetDamaged), an error wrapping bberrors.ErrTimeout when another
// process holds the file's lock, and the operating system's error otherwise.
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
	path := filepath.Join(o.Dir, FileName)
	s := &Store{path: path, depth: o.HistoryDepth}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.db, err = s.open(o, false)
	case err != nil:
		return nil, fmt.Errorf("boltstore: %w", err)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("boltstore: %s is not a regular file", path)
	case fi.Size() == 0:
		err = fmt.Errorf("%w: %s is empty (0 bytes), so it is not a sluice store (a failed copy or a full disk?); %s", ErrDamaged, path, hint)
	default:
		s.db, err = s.open(o, true)
	}
	if errors.Is(err, ErrDamaged) && o.ResetDamaged {
		s.moved = path + ".damaged-" + time.Now().UTC().Format("20060102T150405.000000000Z")
		if rerr := os.Rename(path, s.moved); rerr != nil {
			return nil, fmt.Errorf("boltstore: moving the damaged store aside: %w (it was refused: %v)", rerr, err)
		}
		s.db, err = s.open(o, false)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// hint is what an operator can do about a damaged store file.
const hint = "restore the file from a copy, or start with --reset-damaged-store to move it aside and start with no policies"

// open opens the file; existing says whether it existed. An existing file
// is first opened read-only (which does not load bbolt's freelist) and every
// bucket and key read, so that a damaged tree is found while the handle can
// still be closed; once opened for writing, bbolt's consistency check
// (free and reachable pages) runs too.
func (s *Store) open(o Options, existing bool) (*bolt.DB, error) {
	if existing {
		db, err := s.boltOpen(o, true)
		if err != nil {
			return nil, err
		}
		err = s.guard(func() error { return db.View(s.walk) })
		db.Close()
		if err != nil {
			return nil, fmt.Errorf("%w; %s", err, hint)
		}
	}
	db, err := s.boltOpen(o, false)
	if err != nil {
		return nil, err
	}
	if existing {
		if err := s.guard(func() error { return db.View(s.check) }); err != nil {
			db.Close()
			return nil, fmt.Errorf("%w; %s", err, hint)
		}
	}
	if err := s.guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
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
		})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: init %s: %w", s.path, err)
	}
	return db, nil
}

// boltOpen opens the file with bbolt and classifies its errors: another
// process's lock, the operating system's errors, and the rest (a file bbolt
// does not recognise) as ErrDamaged.
func (s *Store) boltOpen(o Options, readOnly bool) (*bolt.DB, error) {
	var db *bolt.DB
	err := s.guard(func() error {
		var err error
		db, err = bolt.Open(s.path, 0o600, &bolt.Options{Timeout: o.LockTimeout, ReadOnly: readOnly})
		return err
	})
	var errno syscall.Errno
	var pathErr *fs.PathError
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("boltstore: %s is locked by another process (another sluice-controlplane on the same data directory?); gave up waiting after %s: %w",
			s.path, o.LockTimeout, err)
	case errors.Is(err, ErrDamaged):
		return nil, fmt.Errorf("%w; %s", err, hint)
	case errors.As(err, &errno) || errors.As(err, &pathErr):
		return nil, fmt.Errorf("boltstore: open %s: %w", s.path, err)
	default:
		return nil, fmt.Errorf("%w: %s is not a valid sluice store (%v); %s", ErrDamaged, s.path, err, hint)
	}
}

// walk reads every bucket, key and value reachable from the root of an
// existing file, checking first that the file holds all the pages its meta
// page counts (reading past the end of a shortened file would fault).
func (s *Store) walk(tx *bolt.Tx) error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return err
	}
	if fi.Size() < tx.Size() {
		return fmt.Errorf("%w: %s is truncated: %d bytes, but its pages need %d", ErrDamaged, s.path, fi.Size(), tx.Size())
	}
	var sum byte
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(b.Bucket(k))
			}
			for _, c := range v {
				sum ^= c // read the value's pages
			}
			return nil
		})
	}
	err = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		if !bytes.Equal(name, bucketPolicies) && !bytes.Equal(name, bucketMeta) {
			return fmt.Errorf("%w: %s is a bbolt file but not a sluice store (it has a bucket %q)", ErrDamaged, s.path, name)
		}
		return walk(b)
	})
	_ = sum
	return err
}

// check runs bbolt's consistency check. It runs in a goroutine of bbolt's,
// so it comes after walk has read every page it will read.
func (s *Store) check(tx *bolt.Tx) error {
	var first error
	for err := range tx.Check() { // drained: the goroutine reads pages until it closes the channel
		if first == nil {
			first = fmt.Errorf("%w: %s: %v", ErrDamaged, s.path, err)
		}
	}
	return first
}

// guard runs fn, turning a panic or a memory fault (a page bbolt cannot
// decode, a page beyond the end of a file shortened under it) into an error
// wrapping ErrDamaged. bbolt rolls back the transaction of a panicking
// View or Update, releasing its locks.
func (s *Store) guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %s: %v", ErrDamaged, s.path, v)
		}
	}()
	return fn()
}

// view and update run a bbolt transaction under guard.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	return s.guard(func() error { return s.db.View(fn) })
}

func (s *Store) update(fn func(*bolt.Tx) error) error {
	return s.guard(func() error { return s.db.Update(fn) })
}

// MovedAside returns where Open moved a damaged file with
// Options.ResetDamaged, or "" if it did not.
func (s *Store) MovedAside() string { return s.moved }

// Path returns the store file's path.
func (s *Store) Path() string { return s.path }

// epoch returns the file's epoch as of tx.
func epoch(tx *bolt.Tx) string {
	if m := tx.Bucket(bucketMeta); m != nil {
		return string(m.Get(keyEpoch))
	}
	return ""
}

func decodeUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func encodeUint64(v uint64) []byte {
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
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil {
			return nil
		}
		r.Version = decodeUint64(b.Get(keyVersion))
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
	err := s.view(func(tx *bolt.Tx) error {
		e := epoch(tx)
		return tx.Bucket(bucketPolicies).ForEachBucket(func(k []byte) error {
			b := tx.Bucket(bucketPolicies).Bucket(k)
			if b.Get(keyDoc) != nil {
				out = append(out, store.Record{Name: string(k), Version: decodeUint64(b.Get(keyVersion)), Epoch: e})
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
	err := s.update(func(tx *bolt.Tx) error {
		r.Epoch = epoch(tx)
		b, err := tx.Bucket(bucketPolicies).CreateBucketIfNotExists([]byte(c.Name))
		if err != nil {
			return err
		}
		cur := decodeUint64(b.Get(keyVersion))
		if cur != c.Base {
			if c.ID != "" && cur == c.Base+1 && string(b.Get(keyWriteID)) == c.ID {
				r.Version, r.Doc = cur, clone(b.Get(keyDoc))
				return nil
			}
			return store.ErrConflict
		}
		next := cur + 1
		if err := b.Put(keyVersion, encodeUint64(next)); err != nil {
			return err
		}
		if err := b.Put(keyWriteID, []byte(c.ID)); err != nil {
			return err
		}
		entry := store.MarshalEntry(store.EntryOf(c, next))
		if c.Doc == nil {
			// A tombstone: free the document and the history, keep who
			// deleted it when.
			if err := b.Delete(keyDoc); err != nil {
				return err
			}
			if b.Bucket(bucketHistory) != nil {
				if err := b.DeleteBucket(bucketHistory); err != nil {
					return err
				}
			}
			if err := b.Put(keyDeleted, entry); err != nil {
				return err
			}
			r.Version = next
			return nil
		}
		if err := b.Put(keyDoc, c.Doc); err != nil {
			return err
		}
		h, err := b.CreateBucketIfNotExists(bucketHistory)
		if err != nil {
			return err
		}
		if d := b.Get(keyDeleted); d != nil {
			// Re-created: the deletion becomes the first history entry.
			if err := h.Put(encodeUint64(cur), bytes.Clone(d)); err != nil {
				return err
			}
			if err := b.Delete(keyDeleted); err != nil {
				return err
			}
		}
		if err := h.Put(encodeUint64(next), entry); err != nil {
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
	err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil || decodeUint64(b.Get(keyVersion)) == 0 || epoch(tx) != from {
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

// History implements store.Store. A deleted policy's history is only its
// deletion.
func (s *Store) History(_ context.Context, name string) ([]store.HistoryEntry, error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	var out []store.HistoryEntry
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicies).Bucket([]byte(name))
		if b == nil {
			return nil
		}
		if b.Bucket(bucketHistory) == nil {
			if d := b.Get(keyDeleted); d != nil {
				e, err := store.UnmarshalEntry(d)
				if err != nil {
					return err
				}
				out = append(out, e)
			}
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
