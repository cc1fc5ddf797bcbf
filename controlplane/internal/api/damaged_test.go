package api_test

import (
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/boltstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// TestDamagedStoreKeepsServingTheSnapshot: an embedded store file damaged
// under a running control plane makes resyncs and writes fail (not ready,
// 503), while reads go on from the snapshot; nothing panics.
func TestDamagedStoreKeepsServingTheSnapshot(t *testing.T) {
	dir := t.TempDir()
	b := backend{name: "embedded", open: func(t testing.TB) store.Store {
		st, err := boltstore.Open(boltstore.Options{Dir: dir, HistoryDepth: depth})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}}
	r := startReplica(t, b)
	for _, n := range []string{"a", "b", "c", "d"} {
		expect(t, r.admin.Do("PUT", "/v1/policies/"+n, policyDoc(n, 1)), 201, "create "+n)
	}
	f, err := os.OpenFile(filepath.Join(dir, boltstore.FileName), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	g := make([]byte, fi.Size()-2*4096)
	rand.New(rand.NewSource(4)).Read(g)
	if _, err := f.WriteAt(g, 2*4096); err != nil {
		t.Fatal(err)
	}
	f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.snap.Resync(ctx); err == nil {
		t.Fatal("resync of a damaged store succeeded")
	}
	expectCode(t, r.anon.Do("GET", "/readyz", nil), 503, "store_unavailable", "readyz")
	expect(t, r.read.Do("GET", "/v1/policies/a", nil), 200, "read from the snapshot")
	expect(t, r.read.Do("GET", "/v1/policies", nil), 200, "list from the snapshot")
	expectCode(t, r.admin.Do("PUT", "/v1/policies/a", policyDoc("a", 2)), 503, "store_unavailable", "write to a damaged store")
	expectCode(t, r.admin.Do("GET", "/v1/policies/a/versions", nil), 503, "store_unavailable", "history of a damaged store")
}
