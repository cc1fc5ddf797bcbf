package main

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/policysync"
	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestStalledPublisherNeitherRollsBackNorTears runs the real module's rule
// sync with two workers and holds the lease holder (A) inside the callback
// that publishes its policy, before each of its shared-data operations in
// turn, until its lease has lapsed and the other worker (B) has taken the
// lease, polled and published its own version. Then A goes on. Whatever
// the step, the published version is the highest one anybody published,
// and every worker applies it (its chunks read whole).
func TestStalledPublisherNeitherRollsBackNorTears(t *testing.T) {
	buildWasm(t)
	if testing.Short() {
		t.Skip("runs one Envoy per interleaving on the real clock")
	}
	for _, vv := range [][2]int{{5, 6}, {6, 5}} {
		t.Run("A v"+strconv.Itoa(vv[0])+", B v"+strconv.Itoa(vv[1]), func(t *testing.T) {
			retries := 0
			for step := 1; ; step++ {
				switch stalledPublish(t, step, vv[0], vv[1]) {
				case allSteps:
					if step < 6 {
						t.Fatalf("A made only %d shared-data operations while publishing", step-1)
					}
					return
				case again:
					// The lease moved on its own (a tick delayed past the
					// lease on a loaded machine) before A got its policy,
					// or B got it instead.
					if retries++; retries > 5 {
						t.Fatalf("step %d: the lease keeps moving on its own", step)
					}
					step--
				}
			}
		})
	}
}

func churnDoc(version int) string {
	return `{"policy":"p","version":` + strconv.Itoa(version) +
		`,"rules":[{"id":"r` + strconv.Itoa(version) + `","algorithm":"fixed_window","limit":` + strconv.Itoa(version) + `,"window":"1h"}]}`
}

// The outcomes of stalledPublish.
const (
	checked  = iota // the interleaving ran and its outcome is right
	allSteps        // A published before its step-th operation
	again           // the run did not go as planned; run the step again
)

// stalledPublish runs one interleaving: B publishes vb while A is held
// before its step-th shared-data operation in the callback that received
// va.
func stalledPublish(t *testing.T, step, va, vb int) int {
	t.Helper()
	cp := newPolicyServer(t)
	var (
		armed   atomic.Bool
		mu      sync.Mutex
		a       = -2 // the worker that received va
		ops     int
		fired   = make(chan struct{})
		release = make(chan struct{})
	)
	hook := func(worker int, callback, op, key string) {
		if !armed.Load() || callback != "proxy_on_http_call_response" {
			return
		}
		mu.Lock()
		if a == -2 {
			a = worker
		}
		if worker != a {
			mu.Unlock()
			return
		}
		ops++
		hit := ops == step
		mu.Unlock()
		if hit {
			close(fired)
			<-release
		}
	}
	cfg := `{"tick":"20ms","buckets_per_rule":1,` +
		`"control_plane":{"cluster":"cp","policy":"p","wait":"1s","timeout":"2s","lease":"200ms"}}`
	h, err := host.New(t.Context(), host.Config{
		Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
		Workers: 2, LogLevel: host.LogDebug, SharedDataHook: hook,
		Clusters: map[string]string{"cp": strings.TrimPrefix(cp.srv.URL, "http://")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	unhold := sync.OnceFunc(func() { close(release) })
	defer unhold() // before Close, which waits for A's event loop
	e := &env{t: t, h: h}

	// Wait for a lease holder, then hand it va.
	awaitLog(t, h, -1, 0, "took the sync lease")
	armed.Store(true)
	cp.docs <- churnDoc(va)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		select {
		case <-fired:
		default:
			if hasLog(h, -1, 0, "published policy version "+strconv.Itoa(va)+" ") {
				mu.Lock()
				defer mu.Unlock()
				if a < 0 || !hasLog(h, a, 0, "published policy version "+strconv.Itoa(va)+" ") {
					return again
				}
				t.Logf("A published after %d shared-data operations", ops)
				return allSteps
			}
			if time.Now().After(deadline) {
				t.Fatalf("step %d: A neither published nor reached the step", step)
			}
			continue
		}
		break
	}
	mu.Lock()
	b := 1 - a
	mu.Unlock()
	if b < 0 || b > 1 {
		t.Fatalf("step %d: held worker %d", step, a)
	}
	// A is held; its lease lapses, B takes it and publishes vb.
	mark := len(h.Logs())
	cp.docs <- churnDoc(vb)
	awaitLog(t, h, b, mark, "published policy version "+strconv.Itoa(vb)+" ", "below the published")
	if !hasLog(h, b, mark, "published policy version "+strconv.Itoa(vb)+" ") {
		// B refused vb as older than what it had published itself: the
		// lease had moved to B before va arrived, B received va, and the
		// callback held in A was a poll without a document.
		if hasLog(h, b, 0, "published policy version "+strconv.Itoa(va)+" ") {
			return again
		}
		t.Fatalf("step %d: B refused version %d while A held version %d unpublished", step, vb, va)
	}
	if hasLog(h, b, 0, "published policy version "+strconv.Itoa(va)+" ") {
		return again // as above, with vb newer than va: A holds no document
	}
	mark = len(h.Logs())
	unhold()
	awaitLog(t, h, a, mark, "published policy version", "dropped a poll result", "below the published", "could not publish")

	// The published version is the highest published, and every worker
	// applies it.
	published := 0
	for _, l := range h.Logs() {
		if i := strings.Index(l.Message, "published policy version "); i >= 0 {
			v, _ := strconv.Atoi(strings.Fields(l.Message[i+len("published policy version "):])[0])
			published = max(published, v)
		}
	}
	val, _, _ := h.SharedData(policysync.MetaKey("p"))
	m, ok := policysync.DecodeMeta(val)
	if !ok || int(m.Version) != published {
		t.Fatalf("step %d: meta %+v (%v), want version %d, the highest published", step, m, ok, published)
	}
	want := strconv.Itoa(published)
	deadline := time.Now().Add(30 * time.Second)
	for w := range 2 {
		for filterstate.Fields(e.do(w, req{path: "/probe"}).FilterState)["policy_version"] != want {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: worker %d does not apply the published version %s (torn?)", step, w, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return checked
}

// hasLog reports whether a log entry from worker (-1: any) at index ≥ from
// contains one of subs.
func hasLog(h *host.Host, worker, from int, subs ...string) bool {
	logs := h.Logs()
	for _, l := range logs[min(from, len(logs)):] {
		if worker >= 0 && l.Worker != worker {
			continue
		}
		for _, s := range subs {
			if strings.Contains(l.Message, s) {
				return true
			}
		}
	}
	return false
}

// awaitLog waits (bounded by real time, to fail rather than hang) for a
// log entry as hasLog finds it.
func awaitLog(t *testing.T, h *host.Host, worker, from int, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !hasLog(h, worker, from, subs...) {
		if time.Now().After(deadline) {
			logs := h.Logs()
			var b strings.Builder
			for _, l := range logs[max(0, len(logs)-60):] {
				b.WriteString("\n  worker " + strconv.Itoa(l.Worker) + ": " + l.Message)
			}
			t.Fatalf("no log from worker %d containing %q; the last logs:%s", worker, subs, b.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
