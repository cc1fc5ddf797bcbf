package quota

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
