package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// heldPolicyServer is a control plane that serves one policy at version 1,
// once release is closed; until then every poll waits.
func heldPolicyServer(t *testing.T, doc string) (addr string, release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	cp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		if r.Header.Get("If-None-Match") == `"v1"` {
			// A long poll with nothing new: it ends when the caller gives up.
			<-r.Context().Done()
			return
		}
		w.Header().Set("ETag", `"v1"`)
		w.Write([]byte(doc))
	}))
	t.Cleanup(cp.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return strings.TrimPrefix(cp.URL, "http://"), release
}

// startHeld runs one worker of the filter on the system clock with the
// control plane at addr and the control_plane members extra.
func startHeld(t *testing.T, addr, extra string) *host.Host {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice",
		PluginConfig: []byte(`{"tick":"20ms","control_plane":{"cluster":"cp","policy":"default","wait":"1s","timeout":"2s"` + extra + `}}`),
		Workers:      1, Clock: host.SystemClock, LogLevel: host.LogInfo,
		Clusters: map[string]string{"cp": addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// awaitMetric waits until the counter name reaches at least n.
func awaitMetric(t *testing.T, h *host.Host, name string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m, _ := h.Metric(name); m.Value >= n {
			return
		}
		if time.Now().After(deadline) {
			m, _ := h.Metric(name)
			t.Fatalf("%s is %d after 10 s, want %d", name, m.Value, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const onePerHour = `{"policy":"default","version":1,"rules":[{"id":"all","algorithm":"fixed_window","limit":1,"window":"1h"}]}`

// TestARequestBeforeTheFirstPolicyIsHeldForIt: an Envoy that serves before
// its filter has pulled the policy (it just started, or restarted) holds such a
// request, paused, until the policy arrives, and the policy decides it: it is
// counted (the next request is denied), not passed uncounted by fail_mode.
func TestARequestBeforeTheFirstPolicyIsHeldForIt(t *testing.T) {
	addr, release := heldPolicyServer(t, onePerHour)
	h := startHeld(t, addr, `,"first_policy_wait":"10s"`)
	got := make(chan host.Response, 1)
	go func() {
		r, err := h.Worker(0).Do(context.Background(), host.Request{Path: "/a"})
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	awaitMetric(t, h, "sluice.held_for_policy", 1)
	close(release)
	r := <-got
	fs := filterstate.Fields(r.FilterState)
	if r.Status != 200 || fs["rule"] != "all" || fs["reason"] != "" {
		t.Fatalf("the held request: %d %v, want 200 decided by rule all", r.Status, fs)
	}
	if r, _ := h.Worker(0).Do(context.Background(), host.Request{Path: "/a"}); r.Status != 429 {
		t.Fatalf("the next request: %d, want 429 (the held one was counted)", r.Status)
	}
	if m, _ := h.Metric("sluice.no_policy"); m.Value != 0 {
		t.Errorf("sluice.no_policy %d, want 0", m.Value)
	}
}

// TestARequestHeldPastFirstPolicyWaitFollowsFailMode: when no policy comes
// within first_policy_wait, the held request is decided by fail_mode (open:
// it passes, counted as no_policy), and so is every later one at once.
func TestARequestHeldPastFirstPolicyWaitFollowsFailMode(t *testing.T) {
	addr, _ := heldPolicyServer(t, onePerHour)
	h := startHeld(t, addr, `,"first_policy_wait":"200ms"`)
	r, err := h.Worker(0).Do(context.Background(), host.Request{Path: "/a"})
	if err != nil {
		t.Fatal(err)
	}
	if fs := filterstate.Fields(r.FilterState); r.Status != 200 || fs["reason"] != "no_policy" {
		t.Fatalf("the request held past first_policy_wait: %d %v, want 200 with reason no_policy", r.Status, fs)
	}
	awaitMetric(t, h, "sluice.held_for_policy", 1)
	awaitMetric(t, h, "sluice.no_policy", 1)
}
