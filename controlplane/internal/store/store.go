// Package store defines how the control plane keeps policies: one Store
// interface, the records it holds and the errors it returns. The Redis and the
// embedded (bbolt) implementations live in their own packages and are checked
// by one conformance suite (package storetest).
//
// # Model
//
// A policy is stored as its canonical JSON document (rules.EncodePolicy) under
// its name, together with a version counter. Every commit is a compare-and-set
// on that counter: it names the version it was computed from (Change.Base) and
// succeeds only if that version is still current, storing a document that
// carries version Base+1. The counter survives deletion (a deleted policy is a
// tombstone: a version without a document), so a name re-created later never
// reuses an ETag. Each commit also appends a HistoryEntry to a capped,
// newest-first history used for audit and rollback; a deletion first drops
// the history, so that a deleted policy keeps only its deletion entry and no
// documents (its storage is reclaimed).
//
// # Epochs
//
// A version number alone does not identify a document: a store that loses
// acknowledged writes (Redis restarted without persistence, FLUSHALL, a
// failover to a replica that had not received them) counts again from a
// lower number and hands out the lost numbers a second time, for other
// documents. So every record also carries an epoch, an opaque random string
// (NewEpoch) that changes whenever the store's history of a policy may have
// been broken: (name, version, epoch) identifies one document, and readers
// that see the epoch change know that a lower version is newer, not stale.
//
//   - The Redis store keeps one epoch per policy, next to its version in the
//     same hash slot, created by the first commit that finds none. Losing
//     the policy's keys loses the epoch too, so the next commit starts a new
//     one. A loss that leaves an older state with the old epoch (a stale
//     replica promoted) is detected by a reader that saw the higher version
//     (package snapshot), which then calls Rotate.
//   - The embedded store keeps one epoch per file, created with the file:
//     bbolt fsyncs every commit, so its versions never go back while the
//     file lives.
//
// A record with Version 0 (never written) has an empty epoch. Records
// written before epochs existed read with an empty epoch until their next
// commit gives them one.
//
// # Failure policy
//
// A Store acknowledges a commit only once the backing store confirmed it:
// bbolt fsynced it; Redis replied to the script (and, with WAIT configured,
// enough replicas confirmed it). How much a Redis confirmation survives
// depends on Redis's persistence and replication settings, which is why
// records carry epochs (above). Errors other than the sentinels below mean
// the backing store could not be reached or failed; callers report them as
// "store unavailable" and must not assume the commit happened or did not.
//
// # Errors
//
//   - ErrConflict: Change.Base was not the current version.
//   - ErrClosed: the store was closed.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// ErrConflict is returned by Commit when Change.Base is not the current
// version of the policy (another writer committed first).
var ErrConflict = errors.New("store: version conflict")

// ErrClosed is returned by every method after Close.
var ErrClosed = errors.New("store: closed")

// Record is the current state of one policy.
type Record struct {
	// Name is the policy name (rules.ValidName).
	Name string
	// Version is the policy's version counter; 0 if the name was never written.
	Version uint64
	// Doc is the canonical JSON policy document carrying Version, or nil when
	// the policy does not exist (never created, or deleted: a tombstone).
	Doc []byte
	// Epoch identifies the history Version counts in (see "Epochs"): a
	// string of [0-9a-f] (NewEpoch), empty when Version is 0 and for
	// records written before epochs existed.
	Epoch string
	// Sum is Sum(Doc), filled in by the stores so that readers need not
	// hash the document again; "" when Doc is nil or when the record was
	// made by hand (see DocSum).
	Sum string
}

// DocSum returns Sum(r.Doc), computing it only when r.Sum is empty.
func (r Record) DocSum() string {
	if r.Sum != "" || r.Doc == nil {
		return r.Sum
	}
	return Sum(r.Doc)
}

// Exists reports whether the record holds a live policy document.
func (r Record) Exists() bool { return r.Doc != nil }

// Operation names what a commit did; it is recorded in the history.
type Operation string

// The operations the API performs.
const (
	OpPutPolicy    Operation = "put_policy"
	OpDeletePolicy Operation = "delete_policy"
	OpAddRule      Operation = "add_rule"
	OpPutRule      Operation = "put_rule"
	OpDeleteRule   Operation = "delete_rule"
	OpRollback     Operation = "rollback"
	// OpRestore is a control plane writing back the last document it served
	// of a policy the store lost (package snapshot, Options.RestoreLost).
	OpRestore Operation = "restore"
)

// Change is one atomic write.
type Change struct {
	// Name is the policy to write.
	Name string
	// Base is the version the change was computed from; the commit fails with
	// ErrConflict unless Base is still the current version (0: never written).
	Base uint64
	// Doc is the new canonical document, which must carry version Base+1;
	// nil deletes the policy (leaving a tombstone).
	Doc []byte
	// Op, Actor, Detail and Time describe the change for the history.
	Op Operation
	// Actor is who made the change: the token role, optionally followed by
	// the X-Sluice-Actor header ("admin", "admin:alice").
	Actor string
	// Detail is a short free-form note, such as the rule id or the version
	// rolled back to.
	Detail string
	// Time is when the change was made (UTC, stored with millisecond precision).
	Time time.Time
	// ID is a unique identifier of this write attempt; a retried commit whose
	// first attempt did land is reported as a success instead of a conflict.
	ID string
}

// HistoryEntry is one past commit, as kept in a policy's capped history.
type HistoryEntry struct {
	// Version is the version this commit produced.
	Version uint64 `json:"version"`
	// Time is when the commit was made (UTC).
	Time time.Time `json:"time"`
	// Actor is who made it (see Change.Actor).
	Actor string `json:"actor"`
	// Op is what it did.
	Op Operation `json:"op"`
	// Detail is the change's note, possibly empty.
	Detail string `json:"detail,omitempty"`
	// Doc is the document the commit stored; nil for a deletion.
	Doc []byte `json:"doc,omitempty"`
}

// Event tells a subscriber that a policy changed.
type Event struct {
	// Name is the policy that changed; empty means "anything may have
	// changed, re-read everything" (sent when a subscription is established
	// or re-established, since notices may have been missed meanwhile).
	Name string
	// Version is the version the change produced (0 for a resync event).
	Version uint64
	// Epoch is the record's epoch after the change; empty when unknown
	// (resync events, notices from older control planes).
	Epoch string
}

// Store keeps policies, their versions and their history. Implementations
// are safe for concurrent use.
type Store interface {
	// Get returns the current record of name. A name never written yields a
	// Record with Version 0 and nil Doc, and no error.
	Get(ctx context.Context, name string) (Record, error)
	// List returns the names and versions of every live policy (Doc is nil in
	// the results), sorted by name.
	List(ctx context.Context) ([]Record, error)
	// Commit applies c atomically and returns the new record. It returns
	// ErrConflict when c.Base is stale.
	Commit(ctx context.Context, c Change) (Record, error)
	// History returns the retained history of name, newest first (at most
	// the configured depth). A name never written yields an empty slice.
	History(ctx context.Context, name string) ([]HistoryEntry, error)
	// Subscribe delivers change events until ctx is done, then closes the
	// channel. The first event is a resync event (Name ""). Events are hints:
	// a slow subscriber may miss some, and receives a resync event instead.
	Subscribe(ctx context.Context) <-chan Event
	// Rotate gives name a new epoch (NewEpoch) if its epoch is still from,
	// and returns the current record either way: a reader that proved the
	// store lost writes of name under epoch from calls it, so that every
	// reader of the lower versions learns they are a new history. Version,
	// document and history stay. A name never written is returned as is.
	// The embedded store has one epoch per file, so there Rotate changes the
	// epoch of every policy (and sends a resync event).
	Rotate(ctx context.Context, name, from string) (Record, error)
	// Ping checks that the backing store is reachable.
	Ping(ctx context.Context) error
	// Close releases the store's resources.
	Close() error
}

// NewEpoch returns a fresh random epoch: 16 lowercase hex digits (64 bits
// from crypto/rand), so two epochs of one policy collide with probability
// about 2^-64.
func NewEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documentation)
	return hex.EncodeToString(b[:])
}

// Sum returns the content hash of a document: the first 64 bits of its
// SHA-256 (FIPS 180-4) as 16 lowercase hex digits; "" for nil. Different
// documents under one (version, epoch) — which only a store that lost
// writes without anyone noticing can produce — still get different ETags.
func Sum(doc []byte) string {
	if doc == nil {
		return ""
	}
	h := sha256.Sum256(doc)
	return hex.EncodeToString(h[:8])
}
