package quota

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
)

func TestMakeRoomReplacesTheIdentitysLeastRecentEntryOnly(t *testing.T) {
	a, b := Owner("spiffe://td/a"), Owner("spiffe://td/b")
	if a == b || len(a) != 17 {
		t.Fatalf("owners %q %q", a, b)
	}
	v := value{}
	for i := 0; i < 3; i++ {
		v.entries = append(v.entries, entry{envoy: a + "e" + strconv.Itoa(i), last: int64(10 + i), held: 5})
	}
	v.entries = append(v.entries, entry{envoy: b + "x", last: 1, held: 7})
	if makeRoom(&v, a+"e1", a, 3) {
		t.Fatal("a known entry made room")
	}
	if makeRoom(&v, b+"y", b, 3) || makeRoom(&v, "plain", "", 1) {
		t.Fatal("room made under the cap, or without an owner")
	}
	if !makeRoom(&v, a+"new", a, 3) {
		t.Fatal("no room made at the cap")
	}
	if len(v.entries) != 3 || v.entries[0].envoy != a+"e1" || v.entries[2].envoy != b+"x" {
		t.Fatalf("entries after: %+v (want a's e0, its least recent, gone and b's kept)", v.entries)
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
