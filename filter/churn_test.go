package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// policyServer is a control plane that serves the policies sent on docs,
// one per poll, and otherwise answers 304 after a short wait.
type policyServer struct {
	srv  *httptest.Server
	docs chan string
}

func newPolicyServer(t testing.TB) *policyServer {
	t.Helper()
	s := &policyServer{docs: make(chan string, 1)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case doc := <-s.docs:
			w.Header().Set("ETag", `"`+strconv.Itoa(len(doc))+`-`+strconv.FormatInt(time.Now().UnixNano(), 10)+`"`)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, doc)
		case <-time.After(20 * time.Millisecond):
			w.WriteHeader(http.StatusNotModified)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return s
}

// awaitVersion moves the clock tick by tick until every worker enforces
// version v (a request to /r without x-k matches the rule but has no key,
// so it is not counted, and reports the version in filter state); it
// fails the test after a bound of real time.
func (e *env) awaitVersion(v int, tick time.Duration) {
	e.t.Helper()
	want := strconv.Itoa(v)
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := true
		for w := range e.h.Workers() {
			if filterstate.Fields(e.do(w, req{path: "/r"}).FilterState)["policy_version"] != want {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			for _, l := range e.h.Logs() {
				e.t.Logf("worker %d: %s", l.Worker, l.Message)
			}
			e.t.Fatalf("workers do not enforce version %d", v)
		}
		e.clock.Advance(tick)
		time.Sleep(time.Millisecond) // let the callout's answer arrive
	}
}

// sharedBytes is the total size of every shared-data value, and the number
// of keys.
func (e *env) sharedBytes() (bytes, keys int) {
	for _, k := range e.h.SharedDataKeys() {
		v, _, _ := e.h.SharedData(k)
		bytes += len(v)
		keys++
	}
	return bytes, keys
}

// TestRuleChurnKeepsSharedDataBounded: a control plane that renames a rule
// on every version (each version drops the previous rule and adds a new
// one, whose counters fill up) leaves the shared data's total bytes
// bounded: the dropped rules' buckets, and the replaced publications'
// chunks, are shrunk to empty. Only the keys themselves stay (shared data
// cannot delete).
func TestRuleChurnKeepsSharedDataBounded(t *testing.T) {
	buildWasm(t)
	const (
		tick     = 100 * time.Millisecond
		versions = 24
		buckets  = 4
	)
	cp := newPolicyServer(t)
	cfg := `{"tick":"` + tick.String() + `","buckets_per_rule":` + strconv.Itoa(buckets) + `,"entries_per_bucket":8,` +
		// No hold before the first policy: a held probe would wait for a
		// tick of the virtual clock, which only this goroutine advances.
		`"control_plane":{"cluster":"cp","policy":"p","wait":"1s","timeout":"2s","lease":"1s","first_policy_wait":"0s"}}`
	bin := buildWasmTB(t)
	clock := host.NewVirtualClock(epoch)
	h, err := host.New(t.Context(), host.Config{
		Wasm: bin, VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
		Workers: 2, Clock: clock, LogLevel: host.LogInfo,
		Clusters: map[string]string{"cp": strings.TrimPrefix(cp.srv.URL, "http://")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	e := &env{t: t, h: h, clock: clock}

	var sizes, keyCounts []int
	for v := 1; v <= versions; v++ {
		rule := "r" + strconv.Itoa(v)
		cp.docs <- `{"policy":"p","version":` + strconv.Itoa(v) + `,"rules":[` +
			`{"id":"` + rule + `","match":{"path_prefix":"/r"},"key":["header:x-k"],"algorithm":"fixed_window","limit":100,"window":"1h"}]}`
		e.awaitVersion(v, tick)
		// Fill the new rule's buckets: 32 keys over 4 buckets of 8 entries.
		for k := range 32 {
			r := e.do(k%2, req{path: "/r", headers: host.Headers{{"x-k", strconv.Itoa(k)}}})
			if filterstate.Fields(r.FilterState)["rule"] != rule {
				t.Fatalf("version %d: request counted by %q, want %s", v, filterstate.Fields(r.FilterState)["rule"], rule)
			}
		}
		// A few ticks for the previous rule's counters to be retired.
		for range 3 {
			e.clock.Advance(tick)
		}
		bytes, keys := e.sharedBytes()
		sizes, keyCounts = append(sizes, bytes), append(keyCounts, keys)
		t.Logf("version %d: %d bytes in %d keys", v, bytes, keys)
	}
	// One live rule's buckets, one publication, the lease, meta and hash
	// key: what the third version held, within a small margin; not a
	// growth with every version.
	if last, third := sizes[len(sizes)-1], sizes[2]; last > third+third/10 {
		t.Errorf("shared data grew from %d bytes (version 3) to %d bytes (version %d): dropped rules keep their bytes", third, last, versions)
	}
	// What does stay: each dropped rule's buckets_per_rule keys and each
	// replaced publication's chunk key (one for a document under 64 KiB).
	if got, want := keyCounts[len(keyCounts)-1]-keyCounts[2], (versions-3)*(buckets+1); got != want {
		t.Errorf("%d keys added from version 3 to %d, want %d (buckets_per_rule + 1 per version)", got, versions, want)
	}
}
