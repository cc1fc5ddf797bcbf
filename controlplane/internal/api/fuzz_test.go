package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/boltstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
)

// FuzzPutPolicy sends arbitrary bodies to PUT /v1/policies/{policy} and PUT
// and POST of rules through the handler: the answer is never a 5xx, always
// a JSON body, and a 2xx answer serves back a document that parses.
// Seeds: testdata/fuzz/FuzzPutPolicy (plus the examples below).
func FuzzPutPolicy(f *testing.F) {
	for _, seed := range [][]byte{
		policyDoc("p", 1), ruleDoc("r1", 5), []byte(`{}`), []byte(`{"policy":"p","rules":null}`),
		[]byte(`{"policy":"p","version":3,"rules":[]}`), []byte(`{"rules":[{"id":"a","key":["user"],"algorithm":"gcra","limit":1,"window":"1s"}]}`),
	} {
		f.Add(seed)
	}
	if b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "rules", "testdata", "example.json")); err == nil {
		f.Add(b)
	}
	dir := f.TempDir()
	st, err := boltstore.Open(boltstore.Options{Dir: dir, HistoryDepth: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	snap := snapshot.New(snapshot.Options{Store: st, Logger: log})
	if err := snap.Resync(f.Context()); err != nil {
		f.Fatal(err)
	}
	srv := api.New(api.Options{Store: st, Snapshot: snap, AdminToken: adminToken, MaxBodyBytes: 64 << 10, MaxWait: time.Second, HistoryDepth: 3, Logger: log})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, target := range []struct{ method, path string }{
			{"PUT", "/v1/policies/p"}, {"PUT", "/v1/policies/p/rules/r1"}, {"POST", "/v1/policies/p/rules"},
		} {
			req := httptest.NewRequest(target.method, target.path, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+adminToken)
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s with %q → %d %s", target.method, target.path, body, rec.Code, rec.Body)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s → %d with a non-JSON body %q", target.method, target.path, rec.Code, rec.Body)
			}
			if rec.Code < 300 {
				get := httptest.NewRecorder()
				greq := httptest.NewRequest("GET", "/v1/policies/p", nil)
				greq.Header.Set("Authorization", "Bearer "+adminToken)
				srv.ServeHTTP(get, greq)
				if get.Code != http.StatusOK || !json.Valid(get.Body.Bytes()) {
					t.Fatalf("after %d, GET → %d %s", rec.Code, get.Code, get.Body)
				}
			}
		}
	})
}
