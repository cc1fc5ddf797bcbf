package quota

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMakeRoomReplacesOnlyAnIdentitysEntryWithoutALiveLease(t *testing.T) {
	a, b := Owner("spiffe://td/a"), Owner("spiffe://td/b")
	if a == b || len(a) != 17 {
		t.Fatalf("owners %q %q", a, b)
	}
	const now, active = 100, 1000
	v := value{}
	for i := 0; i < 3; i++ {
		v.entries = append(v.entries, entry{envoy: a + "e" + strconv.Itoa(i), last: int64(10 + i), held: 5, exp: now + 10})
	}
	v.entries = append(v.entries, entry{envoy: b + "x", last: 1, held: 7, exp: now + 10})
	if ev, full := makeRoom(&v, a+"e1", a, 3, now, active); ev || full {
		t.Fatal("a known entry made room")
	}
	if ev, full := makeRoom(&v, b+"y", b, 3, now, active); ev || full {
		t.Fatal("room made under the cap")
	}
	if ev, full := makeRoom(&v, "plain", "", 1, now, active); ev || full {
		t.Fatal("room made without an owner")
	}
	// Every entry of a holds a live lease and reports: full, nothing removed.
	if ev, full := makeRoom(&v, a+"new", a, 3, now, active); ev || !full || len(v.entries) != 4 {
		t.Fatalf("at the cap with live leases: evicted %v, full %v, %d entries", ev, full, len(v.entries))
	}
	// The same Envoys gone quiet (no report for longer than retain): the least
	// recent gives way; its units stay counted.
	w := value{entries: append([]entry(nil), v.entries...)}
	if ev, full := makeRoom(&w, a+"new", a, 3, now, 50); !ev || full || w.entries[0].envoy != a+"e1" {
		t.Fatalf("at the cap with quiet live leases: evicted %v, full %v, entries %+v (want e0 gone)", ev, full, w.entries)
	}
	// e2's lease ended, e1 holds nothing, e0 is quiet with a live lease: an entry
	// without a live lease goes first, e1 being the less recent of those.
	v.entries[2].exp = now
	v.entries[1].held = 0
	if ev, full := makeRoom(&v, a+"new", a, 3, now, 50); !ev || full {
		t.Fatalf("at the cap with two dead leases: evicted %v, full %v", ev, full)
	}
	if len(v.entries) != 3 || v.entries[0].envoy != a+"e0" || v.entries[1].envoy != a+"e2" || v.entries[2].envoy != b+"x" {
		t.Fatalf("entries after: %+v (want a's e1, its least recent without a live lease, gone)", v.entries)
	}
}

func TestEntryNamesOfTokenCallersCannotBeCertificateOwners(t *testing.T) {
	owner := Owner("spiffe://td/ns/prod/sa/victim")
	// A token caller sending the victim's entry name as its envoy id gets another.
	if EntryName("", owner+"e-1") == EntryName(owner, "e-1") {
		t.Fatal("a token caller named a certificate identity's entry")
	}
	if !strings.HasPrefix(EntryName("", "x"), TokenOwner) || strings.HasPrefix(owner, TokenOwner) {
		t.Fatalf("token entries %q, owner %q", EntryName("", "x"), owner)
	}
}

func TestMemoryBackendBoundsItsKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMemory()
	m.Now = func() time.Time { return now }
	m.MaxKeys = 3
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if ok, err := m.Swap(ctx, []Op{{Key: "k" + strconv.Itoa(i), New: []byte("v"), TTL: time.Second}}); err != nil || !ok[0] {
			t.Fatalf("key %d: %v %v", i, ok, err)
		}
	}
	if _, err := m.Swap(ctx, []Op{{Key: "k3", New: []byte("v"), TTL: time.Second}}); !errors.Is(err, ErrMemoryFull) {
		t.Fatalf("a fourth key: %v, want ErrMemoryFull", err)
	}
	// A live key is still written; an expired one frees its place.
	if ok, err := m.Swap(ctx, []Op{{Key: "k0", Old: []byte("v"), New: []byte("w"), TTL: 5 * time.Second}}); err != nil || !ok[0] {
		t.Fatalf("rewrite of a live key: %v %v", ok, err)
	}
	now = now.Add(2 * time.Second)
	if ok, err := m.Swap(ctx, []Op{{Key: "k3", New: []byte("v"), TTL: time.Second}}); err != nil || !ok[0] {
		t.Fatalf("after expiry: %v %v", ok, err)
	}
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2 (k0 and k3)", m.Len())
	}
}
