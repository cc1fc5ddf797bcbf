package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// epoch is the virtual clock's start: a whole second, so that window
// boundaries and reset values are exact.
var epoch = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// env is one Envoy (a testenv host running build/sluice.wasm) on a virtual
// clock.
type env struct {
	t     testing.TB
	h     *host.Host
	clock *host.VirtualClock
}

// newEnv starts workers VMs of the filter with the plugin configuration
// cfg (JSON) and a canary, as Envoy does.
func newEnv(t testing.TB, cfg string, workers int) *env {
	t.Helper()
	bin := buildWasmTB(t)
	clock := host.NewVirtualClock(epoch)
	h, err := host.New(context.Background(), host.Config{
		Wasm: bin, VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
		Workers: workers, Clock: clock, LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	t.Cleanup(func() {
		// The filter logs at error level only for a recovered panic or a
		// host failure: either is a bug.
		for _, l := range h.Logs() {
			if l.Level >= host.LogError {
				t.Errorf("guest error log (worker %d): %.3000s", l.Worker, l.Message)
			}
		}
		h.Close()
	})
	return &env{t: t, h: h, clock: clock}
}

// req is a request to send: path, method, client address and headers.
type req struct {
	method, path, src string
	headers           host.Headers
	upstream          func(host.UpstreamRequest) host.UpstreamResponse
}

func (e *env) do(worker int, r req) host.Response {
	e.t.Helper()
	src := r.src
	if src == "" {
		src = "203.0.113.7:40000"
	}
	resp, err := e.h.Worker(worker).Do(context.Background(), host.Request{
		Method: r.method, Path: r.path, Headers: r.headers,
		Info: host.StreamInfo{SourceAddress: src}, Upstream: r.upstream,
	})
	if err != nil {
		e.t.Fatalf("Do %s %s: %v", r.method, r.path, err)
	}
	return resp
}

// metric returns a metric's value after one tick: the filter sums its
// counters in each VM and hands them to the host on its tick. Every test
// configures "tick":"1m", so this moves the clock a minute.
func (e *env) metric(name string) int64 {
	e.clock.Advance(time.Minute)
	m, _ := e.h.Metric(name)
	return m.Value
}

// replyBody is the JSON body of a local reply.
type replyBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Rule      string `json:"rule"`
		Limit     uint64 `json:"limit"`
		Remaining uint64 `json:"remaining"`
		Reset     uint64 `json:"reset"`
	} `json:"data"`
	Timestamp string `json:"timestamp"`
	TraceID   string `json:"trace_id"`
}

func decodeReply(t testing.TB, resp host.Response) replyBody {
	t.Helper()
	if resp.LocalReply == nil {
		t.Fatalf("no local reply: status %d", resp.Status)
	}
	var b replyBody
	dec := json.NewDecoder(strings.NewReader(string(resp.LocalReply.Body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("reply body %q: %v", resp.LocalReply.Body, err)
	}
	return b
}

// wantHeaders checks the named headers' values exactly ("" = absent).
func wantHeaders(t testing.TB, got host.Headers, want map[string]string) {
	t.Helper()
	for k, v := range want {
		g, ok := got.Lookup(k)
		if v == "" && ok {
			t.Errorf("header %s = %q, want absent", k, g)
		} else if v != "" && g != v {
			t.Errorf("header %s = %q, want %q", k, g, v)
		}
	}
}

// wantState checks filter-state values exactly (keys without "wasm."; ""
// = absent).
func wantState(t testing.TB, fs map[string]string, want map[string]string) {
	t.Helper()
	fields := filterstate.Fields(fs)
	for k, v := range want {
		g, ok := fields[strings.TrimPrefix(k, "sluice.")]
		if v == "" && ok {
			t.Errorf("filter state %s = %q, want absent", k, g)
		} else if v != "" && g != v {
			t.Errorf("filter state %s = %q, want %q", k, g, v)
		}
	}
}

// buildWasmTB builds the module once per test binary, for benchmarks too.
func buildWasmTB(tb testing.TB) []byte {
	tb.Helper()
	if wasmBin == nil {
		wasmBin = mustBuild(tb)
	}
	return wasmBin
}
