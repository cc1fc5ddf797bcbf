package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/controlplane/internal/boltstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/redisstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

const (
	adminToken = "admin-secret"
	readToken  = "read-secret"
	depth      = 5
)

// backend opens stores on one shared backing service: every call to open
// returns a new Store on the same data (a new replica).
type backend struct {
	name  string
	open  func(t testing.TB) store.Store
	redis *redisproc.Server
}

func init() { redisstore.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) }

func redisBackend(t testing.TB, opts redisproc.Options) backend {
	srv := redisproc.Start(t, opts)
	return backend{name: "redis", redis: srv, open: func(t testing.TB) store.Store {
		st, err := redisstore.Open(redisstore.Options{URL: srv.URL(), HistoryDepth: depth, OpTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}}
}

func boltBackend(t testing.TB) backend {
	dir := t.TempDir()
	return backend{name: "embedded", open: func(t testing.TB) store.Store {
		st, err := boltstore.Open(boltstore.Options{Dir: dir, HistoryDepth: depth})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}}
}

// backends returns both stores, for tests that must hold on each.
func backends(t *testing.T) []backend {
	return []backend{redisBackend(t, redisproc.Options{}), boltBackend(t)}
}

type replica struct {
	srv   *api.Server
	ts    *httptest.Server
	snap  *snapshot.Snapshot
	admin *apitest.Client
	read  *apitest.Client
	anon  *apitest.Client
}

type option func(*api.Options)

func startReplica(t testing.TB, b backend, opts ...option) *replica {
	t.Helper()
	return start(t, b, true, nil, opts)
}

// startRestoringReplica starts a replica whose view writes back a policy
// the store lost (snapshot.Options.RestoreLost).
func startRestoringReplica(t testing.TB, b backend, opts ...option) *replica {
	t.Helper()
	return start(t, b, true, func(o *snapshot.Options) { o.RestoreLost = true }, opts)
}

// startReplicaUnsynced starts a replica without requiring its first resync
// to succeed (the store may be down).
func startReplicaUnsynced(t testing.TB, b backend, opts ...option) *replica {
	t.Helper()
	return start(t, b, false, nil, opts)
}

func start(t testing.TB, b backend, sync bool, snapOpt func(*snapshot.Options), opts []option) *replica {
	t.Helper()
	st := b.open(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	so := snapshot.Options{Store: st, Logger: log, ResyncInterval: 250 * time.Millisecond}
	if snapOpt != nil {
		snapOpt(&so)
	}
	snap := snapshot.New(so)
	ctx, cancel := context.WithCancel(context.Background())
	if err := snap.Resync(ctx); err != nil && sync {
		t.Fatalf("initial resync: %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); snap.Run(ctx) }()
	o := api.Options{Store: st, Snapshot: snap, AdminToken: adminToken, ReadToken: readToken,
		MaxBodyBytes: 256 << 10, MaxWait: 20 * time.Second, HistoryDepth: depth, Logger: log}
	for _, f := range opts {
		f(&o)
	}
	srv := api.New(o)
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		srv.Drain()
		ts.Close()
		cancel()
		<-done
		st.Close()
	})
	return &replica{srv: srv, ts: ts, snap: snap,
		admin: apitest.New(t, ts.URL, adminToken),
		read:  apitest.New(t, ts.URL, readToken),
		anon:  apitest.New(t, ts.URL, "")}
}

// policyDoc is a valid policy with one fixed_window rule of the given limit.
func policyDoc(name string, limit int) []byte {
	return []byte(fmt.Sprintf(`{"policy":%q,"rules":[{"id":"r1","algorithm":"fixed_window","limit":%d,"window":"1m"}]}`, name, limit))
}

func ruleDoc(id string, limit int) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"algorithm":"token_bucket","limit":%d,"window":"1s"}`, id, limit))
}

func expect(t testing.TB, r *apitest.Response, status int, what string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.Status, status, r.Body)
	}
}

// errorFields returns the field of each detail of an error body, in order.
func errorFields(t testing.TB, r *apitest.Response) []string {
	t.Helper()
	var eb struct {
		Error struct {
			Details []struct{ Field, Message string }
		}
	}
	r.JSON(t, &eb)
	var fields []string
	for _, d := range eb.Error.Details {
		fields = append(fields, d.Field)
	}
	return fields
}

func expectCode(t testing.TB, r *apitest.Response, status int, code, what string) {
	t.Helper()
	expect(t, r, status, what)
	if got := r.ErrorCode(); got != code {
		t.Fatalf("%s: error code %q, want %q; body %s", what, got, code, r.Body)
	}
}

type policyBody struct {
	Policy  string `json:"policy"`
	Version uint64 `json:"version"`
	Rules   []struct {
		ID    string `json:"id"`
		Limit int    `json:"limit"`
	} `json:"rules"`
}

func decodePolicy(t testing.TB, r *apitest.Response) policyBody {
	t.Helper()
	var p policyBody
	r.JSON(t, &p)
	if tagVersion(r.ETag()) != p.Version {
		t.Fatalf("ETag %q, body version %d", r.ETag(), p.Version)
	}
	return p
}

// tagVersion returns the version an ETag "v<version>.<epoch>.<sum>" names
// (0 if it is not one).
func tagVersion(tag string) uint64 {
	rest, ok := strings.CutPrefix(tag, `"v`)
	if !ok {
		return 0
	}
	v, _, _ := strings.Cut(rest, ".")
	n, _ := strconv.ParseUint(v, 10, 64)
	return n
}
