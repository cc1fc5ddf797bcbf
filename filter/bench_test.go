package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// The benchmarks run full streams (request headers, upstream, response
// headers, on_log/on_done/on_delete) through one worker VM of the testenv
// host, so ns/op and allocs/op include the host's own work; the floor
// plugin (testdata/floor: reads the same request headers and
// source.address, then continues) measures that part, and the call floor
// (testdata/callfloor: sluice's host calls without its logic) what the
// design's host calls add to it. Run them side by side:
//
//	go test ./filter -run '^$' -bench 'Request' -benchmem -count 6
//	go test ./filter -run '^$' -bench 'LinearMemory' -benchtime 10000000x

// benchRule is the one-rule policy: per user (else client IP), a limit no
// benchmark reaches, so every request takes the allowed path.
const benchRule = `{"id":"r0","key":["user|client_ip"],"algorithm":"token_bucket","limit":1000000000000,"window":"1s"}`

func benchPolicy(rules ...string) string { return benchPolicyHeaders("", rules...) }

// benchPolicyHeaders is benchPolicy with the policy member response_headers
// set to responseHeaders, a JSON object ("": absent).
func benchPolicyHeaders(responseHeaders string, rules ...string) string {
	rh := ""
	if responseHeaders != "" {
		rh = `"response_headers":` + responseHeaders + `,`
	}
	return `{"policy":"bench","version":1,"identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},` + rh + `"rules":[` +
		strings.Join(rules, ",") + `]}`
}

// fiveRules is benchRule and four more rules on the same key with other
// algorithms, none of which a benchmark exhausts.
func fiveRules() []string {
	return []string{benchRule,
		`{"id":"r1","key":["user","route"],"algorithm":"time_wheel","limit":1000000000,"window":"1h","slots":60}`,
		`{"id":"r2","key":["user"],"algorithm":"fixed_window","limit":1000000000,"window":"1h"}`,
		`{"id":"r3","key":["user"],"algorithm":"gcra","limit":1000000000,"window":"1s","burst":1000000000}`,
		`{"id":"r4","key":["user"],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}`,
	}
}

// floorBins holds the benchmark floors built so far, by directory.
var floorBins = map[string][]byte{}

// buildFloor builds the plugin in testdata/<name> (floor or callfloor) once
// per test binary.
func buildFloor(tb testing.TB, name string) []byte {
	tb.Helper()
	if bin, ok := floorBins[name]; ok {
		return bin
	}
	out := filepath.Join(tb.TempDir(), name+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building the %s plugin: %v\n%s", name, err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	floorBins[name] = bin
	return bin
}

func benchHost(b *testing.B, bin []byte, cfg string) *host.Host {
	b.Helper()
	h, err := host.New(context.Background(), host.Config{
		Wasm: bin, VMID: "bench", PluginConfig: []byte(cfg), NoCanary: true,
		Clock: host.NewVirtualClock(epoch), LogLevel: host.LogWarn,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h
}

// BenchmarkRequest: the floor, the call floor (the host calls of sluice's
// one-rule request, allowed and denied, without its logic), then sluice
// with a policy whose rules match nothing, one rule, five rules, one rule
// over a million distinct keys (a new user per request, cycling through
// 1,000,000), and one rule of limit 1 that denies every request (a local
// reply 429). Besides ns/op and allocs/op each reports hostcalls/op: every
// import the guest called (proxy_* and WASI, host.Host.ImportCalls) per
// request, the floors' included.
func BenchmarkRequest(b *testing.B) {
	sluice := buildWasmTB(b)
	floor, callFloor := buildFloor(b, "floor"), buildFloor(b, "callfloor")
	noMatch := `{"id":"r0","match":{"path_prefix":"/elsewhere"},"key":["user"],"algorithm":"gcra","limit":10,"window":"1s"}`
	denyAll := `{"id":"r0","key":["user|client_ip"],"algorithm":"token_bucket","limit":1,"window":"1h"}`
	for _, bc := range []struct {
		name   string
		bin    []byte
		cfg    string
		users  int
		status int // every request's status; 0 means 200
	}{
		{"floor", floor, "", 1, 0},
		{"call_floor", callFloor, "", 1, 0},
		{"call_floor_denied", callFloor, "deny", 1, 429},
		{"no_rule", sluice, `{"tick":"1m","policy":` + benchPolicy(noMatch) + `}`, 1, 0},
		{"one_rule", sluice, `{"tick":"1m","policy":` + benchPolicy(benchRule) + `}`, 1, 0},
		{"five_rules", sluice, `{"tick":"1m","policy":` + benchPolicy(fiveRules()...) + `}`, 1, 0},
		{"one_rule_1M_keys", sluice, `{"tick":"1m","policy":` + benchPolicy(benchRule) + `}`, 1_000_000, 0},
		{"one_rule_denied", sluice, `{"tick":"1m","policy":` + benchPolicy(denyAll) + `}`, 1, 429},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := benchHost(b, bc.bin, bc.cfg)
			w := h.Worker(0)
			ctx := context.Background()
			users := make([]string, min(bc.users, 1_000_000))
			for i := range users {
				users[i] = "user-" + strconv.Itoa(i)
			}
			r := host.Request{Path: "/v1/api/items", Headers: host.Headers{{"x-user-id", ""}, {"x-tenant-id", "acme"}},
				Info: host.StreamInfo{SourceAddress: "203.0.113.7:40000"}}
			want := bc.status
			if want == 0 {
				want = 200
			} else {
				// The first request spends the limit of 1.
				r.Headers[0][1] = users[0]
				if resp, err := w.Do(ctx, r); err != nil || resp.Status != 200 {
					b.Fatalf("first request: %d %v", resp.Status, err)
				}
			}
			h.ResetImportCalls()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.Headers[0][1] = users[i%len(users)]
				resp, err := w.Do(ctx, r)
				if err != nil || resp.Status != want {
					b.Fatalf("request %d: %d %v", i, resp.Status, err)
				}
			}
			b.StopTimer()
			var calls uint64
			for _, n := range h.ImportCalls() {
				calls += n
			}
			b.ReportMetric(float64(calls)/float64(b.N), "hostcalls/op")
		})
	}
}

// BenchmarkRequestWithBody: one allowed request of the one-rule policy with a
// body of 8 chunks of 1 KiB each way (a POST and its response), stream by stream
// through the host's callbacks: what each body chunk costs on top of the headers.
func BenchmarkRequestWithBody(b *testing.B) {
	h := benchHost(b, buildWasmTB(b), `{"tick":"1m","policy":`+benchPolicy(benchRule)+`}`)
	w := h.Worker(0)
	ctx := context.Background()
	chunk := make([]byte, 1024)
	reqHeaders := host.Headers{{":method", "POST"}, {":path", "/v1/api/items"}, {":authority", "bench"}, {"x-user-id", "u"}, {"x-tenant-id", "acme"}}
	respHeaders := host.Headers{{":status", "200"}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s, err := w.NewStream(host.StreamInfo{SourceAddress: "203.0.113.7:40000"})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := s.RequestHeaders(ctx, reqHeaders, false); err != nil || st != host.Continue {
			b.Fatalf("request headers: %v %v", st, err)
		}
		for k := range 8 {
			if _, err := s.RequestBody(ctx, chunk, k == 7); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.ResponseHeaders(ctx, respHeaders, false); err != nil {
			b.Fatal(err)
		}
		for k := range 8 {
			if _, err := s.ResponseBody(ctx, chunk, k == 7); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Finish(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
