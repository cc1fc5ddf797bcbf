package api_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
)

const seed = `{"policy":"edge","rules":[{"id":"per-ip","algorithm":"fixed_window","limit":100,"window":"1m","key":["client_ip"]}]}`

// TestBootstrapNeverTouchesAWrittenPolicy: Bootstrap creates version 1 of a name
// the store never held, once however many replicas try, and leaves alone a policy
// that exists or was deleted.
func TestBootstrapNeverTouchesAWrittenPolicy(t *testing.T) {
	b := boltBackend(t)
	r := startReplica(t, b)
	ctx := context.Background()
	if created, err := r.srv.Bootstrap(ctx, []byte(seed)); err != nil || !created {
		t.Fatalf("first bootstrap: %v %v", created, err)
	}
	if created, err := r.srv.Bootstrap(ctx, []byte(seed)); err != nil || created {
		t.Fatalf("second bootstrap: %v %v, want nothing done", created, err)
	}
	if g := r.admin.Do("GET", "/v1/policies/edge", nil); g.Status != 200 || !strings.HasPrefix(g.Header.Get("ETag"), `"v1.`) {
		t.Fatalf("after bootstrap: %d %s", g.Status, g.Header.Get("ETag"))
	}
	if d := r.admin.Do("DELETE", "/v1/policies/edge", nil); d.Status != 200 {
		t.Fatalf("DELETE %d", d.Status)
	}
	if created, err := r.srv.Bootstrap(ctx, []byte(seed)); err != nil || created {
		t.Fatalf("bootstrap after DELETE: %v %v, want the deletion kept", created, err)
	}
	if g := r.admin.Do("GET", "/v1/policies/edge", nil); g.Status != 404 {
		t.Fatalf("after DELETE and bootstrap: %d", g.Status)
	}
	if _, err := r.srv.Bootstrap(ctx, []byte(`{"rules":[]}`)); !errors.Is(err, api.ErrBootstrapInvalid) {
		t.Fatalf("a document without a name: %v", err)
	}
}
