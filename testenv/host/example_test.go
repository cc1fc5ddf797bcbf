package host_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// examplePolicy is the plugin configuration of the examples: one static
// rule, two requests per user per minute (fixed_window), X-RateLimit-*
// headers on allowed responses too, no control plane.
const examplePolicy = `{"env":"prod","tick":"1s","policy":{"policy":"demo","version":1,
 "identity":{"user_header":"x-user-id"},
 "response_headers":{"set":"x-ratelimit","on_allow":true},
 "rules":[{"id":"per-user","key":["user"],"algorithm":"fixed_window","limit":2,"window":"1m"}]}}`

var (
	sluiceOnce sync.Once
	sluiceWasm []byte
	sluiceErr  error
)

// buildSluice builds the real filter the way make wasm does
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared ./filter), into a
// temporary directory, once per test binary, so the examples never run
// a stale build/sluice.wasm.
func buildSluice() ([]byte, error) {
	sluiceOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hostexample")
		if err != nil {
			sluiceErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "sluice.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "../../filter")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			sluiceErr = fmt.Errorf("go build ./filter: %v\n%s", err, msg)
			return
		}
		sluiceWasm, sluiceErr = os.ReadFile(out)
	})
	return sluiceWasm, sluiceErr
}

// Run the sluice filter in two worker VMs on a virtual clock, send one
// user's requests through Worker.Do, and read what Envoy's access log
// would read: the response, the local reply and the filter state
// (wasm.sluice, read with package filterstate). Moving the clock fires the due ticks on every worker
// and lets the window pass.
func Example() {
	wasm, err := buildSluice()
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	clock := host.NewVirtualClock(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	h, err := host.New(ctx, host.Config{
		Wasm: wasm, VMID: "sluice", PluginName: "sluice",
		PluginConfig: []byte(examplePolicy), Workers: 2, Clock: clock,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	send := func(worker int) {
		resp, err := h.Worker(worker).Do(ctx, host.Request{
			Path: "/api", Headers: host.Headers{{"x-user-id", "u1"}},
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("worker %d: %d remaining=%s local_reply=%t rate_limited=%s key=%s\n",
			worker, resp.Status, resp.Headers.Get("x-ratelimit-remaining"), resp.LocalReply != nil,
			filterstate.Fields(resp.FilterState)["rate_limited"], filterstate.Fields(resp.FilterState)["key"])
	}
	send(0)
	send(1) // the other worker sees the same counter (shared data)
	send(0)
	clock.Advance(time.Minute) // the window passes; due ticks fire
	send(1)

	// Output:
	// worker 0: 200 remaining=1 local_reply=false rate_limited=false key=rl:prod:demo/per-user:user=u1:60s
	// worker 1: 200 remaining=0 local_reply=false rate_limited=false key=rl:prod:demo/per-user:user=u1:60s
	// worker 0: 429 remaining=0 local_reply=true rate_limited=true key=rl:prod:demo/per-user:user=u1:60s
	// worker 1: 200 remaining=1 local_reply=false rate_limited=false key=rl:prod:demo/per-user:user=u1:60s
}

// Drive one stream phase by phase, as a proxy does: request headers
// (the filter decides here), response headers (the filter adds its
// rate-limit headers), then Finish, which runs on_log, on_done and
// on_delete in Envoy's order.
func ExampleWorker_NewStream() {
	wasm, err := buildSluice()
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	h, err := host.New(ctx, host.Config{
		Wasm: wasm, VMID: "sluice", PluginName: "sluice",
		PluginConfig: []byte(examplePolicy),
		Clock:        host.NewVirtualClock(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	s, err := h.Worker(0).NewStream(host.StreamInfo{SourceAddress: "203.0.113.7:40000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := s.RequestHeaders(ctx, host.Headers{
		{":method", "GET"}, {":path", "/api"}, {":authority", "api"}, {":scheme", "http"},
		{"x-user-id", "u2"},
	}, true)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("request headers:", st)
	if _, err := s.ResponseHeaders(ctx, host.Headers{{":status", "200"}}, true); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("x-ratelimit-limit:", s.ResponseHeaderMap().Get("x-ratelimit-limit"))
	if err := s.Finish(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rule:", filterstate.Fields(s.FilterState())["rule"])

	// Output:
	// request headers: Continue
	// x-ratelimit-limit: 2
	// rule: per-user
}
