package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// memoryRun sends n requests with distinct users (cycling through keys
// users) through worker 0 and returns the guest's linear memory size in
// bytes after warm requests and after all n.
func memoryRun(tb testing.TB, w *host.Worker, warm, n, keys int) (afterWarm, afterAll uint32) {
	tb.Helper()
	ctx := context.Background()
	r := host.Request{Path: "/v1/api/items", Headers: host.Headers{{"x-user-id", ""}},
		Info: host.StreamInfo{SourceAddress: "203.0.113.7:40000"}}
	var name []byte
	for i := 0; i < n; i++ {
		if i == warm {
			afterWarm = w.MemorySize()
		}
		name = strconv.AppendInt(append(name[:0], "user-"...), int64(i%keys), 10)
		r.Headers[0][1] = string(name)
		resp, err := w.Do(ctx, r)
		if err != nil || resp.Status != 200 {
			tb.Fatalf("request %d: %d %v", i, resp.Status, err)
		}
	}
	return afterWarm, w.MemorySize()
}

// TestMemoryStableAfterWarmup: after warm-up, requests over distinct keys do
// not grow the guest's linear memory.
func TestMemoryStableAfterWarmup(t *testing.T) {
	buildWasm(t)
	warm, n := 20_000, 60_000
	if testing.Short() {
		warm, n = 5_000, 20_000
	}
	e := newEnv(t, `{"tick":"1m","policy":`+benchPolicy(benchRule)+`}`, 1)
	a, b := memoryRun(t, e.h.Worker(0), warm, n, 1_000_000)
	t.Logf("linear memory: %d bytes after %d requests, %d after %d", a, warm, b, n)
	// One 64 KiB page of slack for the Go heap settling; a per-request
	// leak of even a few bytes would show as hundreds of KiB here.
	if b > a+64<<10 {
		t.Errorf("linear memory grew from %d to %d bytes after warm-up", a, b)
	}
}

// BenchmarkLinearMemory reports the guest's linear memory after b.N
// requests over a million distinct keys (one rule), and after the first
// 100,000 (warm-up). Run with -benchtime 10000000x for the 10-million figure.
func BenchmarkLinearMemory(b *testing.B) {
	h := benchHost(b, buildWasmTB(b), `{"tick":"1m","policy":`+benchPolicy(benchRule)+`}`)
	w := h.Worker(0)
	before := w.MemorySize()
	warm := min(100_000, b.N/2)
	b.ResetTimer()
	a, end := memoryRun(b, w, warm, b.N, 1_000_000)
	b.StopTimer()
	b.ReportMetric(float64(before), "B-start")
	b.ReportMetric(float64(a), "B-warm")
	b.ReportMetric(float64(end), "B-final")
	b.ReportMetric(float64(int64(end)-int64(a)), "B-growth")
}
