package main

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestFailModes: without a policy, fail_mode open passes (reason
// no_policy), closed denies with 503.
func TestFailModes(t *testing.T) {
	buildWasm(t)
	e := newEnv(t, `{"tick":"1m"}`, 1)
	r := e.do(0, req{path: "/"})
	if r.Status != 200 {
		t.Fatalf("open: %d", r.Status)
	}
	wantState(t, r.FilterState, map[string]string{"sluice.rate_limited": "false", "sluice.reason": "no_policy"})
	if got := e.metric("sluice.failed_open"); got != 1 {
		t.Errorf("failed_open = %d", got)
	}
	e = newEnv(t, `{"tick":"1m","fail_mode":"closed"}`, 1)
	r = e.do(0, req{path: "/"})
	if r.Status != 503 {
		t.Fatalf("closed: %d", r.Status)
	}
	wantHeaders(t, r.Headers, map[string]string{"retry-after": "1", "content-type": "application/json"})
	wantState(t, r.FilterState, map[string]string{"sluice.rate_limited": "true", "sluice.reason": "no_policy"})
	if b := decodeReply(t, r); b.Code != 503 || b.Message != "no rate-limit policy loaded" {
		t.Errorf("body %+v", b)
	}
}

// TestInvalidConfigurationFailsConfigure: Envoy refuses the filter, and the
// log names the field.
func TestInvalidConfigurationFailsConfigure(t *testing.T) {
	bin := buildWasm(t)
	for cfg, field := range map[string]string{
		`{"trusted_hops":1}`:  "trusted_hops: no longer supported: the client address is Envoy's trusted client address (source.address); set xff_num_trusted_hops",
		`{"headers":"fancy"}`: "headers: must be",
		`{"nope":1}`:          "nope: unknown field",
		`{"policy":{"policy":"p","rules":[{"id":"r","algorithm":"gcra","limit":1}]}}`: "policy.rules[0].window",
		`{"control_plane":{}}`: "control_plane.cluster: required",
		`[`:                    "config: ",
		`{"entries_per_bucket":64,"policy":{"policy":"p","rules":[{"id":"r","algorithm":"sliding_log","limit":64,"window":"1s"}]}}`: "policy.rules[0]: a bucket",
	} {
		var logs strings.Builder
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		h, err := host.New(context.Background(), host.Config{Wasm: bin, PluginConfig: []byte(cfg), NoCanary: true, Logger: logger})
		if err == nil {
			h.Close()
			t.Errorf("%s: configure succeeded", cfg)
			continue
		}
		if !errors.Is(err, host.ErrConfigureFailed) {
			t.Errorf("%s: %v, want ErrConfigureFailed", cfg, err)
			continue
		}
		if !strings.Contains(logs.String(), field) {
			t.Errorf("%s: logs do not name %q:\n%s", cfg, field, logs.String())
		}
	}
}

// TestHostileRequests: random header sets and values (binary, huge,
// thousands of headers, missing pseudo-headers) never trap the VM, never
// produce anything but 200 or 429, and leave the filter working.
func TestHostileRequests(t *testing.T) {
	buildWasm(t)
	// Two policies: one reads a few headers one by one, the other more than
	// eight, which makes the filter read the whole map at once.
	few := `{"policy":"p","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"rules":[
	  {"id":"k","key":["header:x-api-key|client_ip","user|tenant"],"algorithm":"token_bucket","limit":3,"window":"1m","cost_header":"x-cost","max_cost":2},
	  {"id":"m","match":{"path_prefix":"/a","headers":[{"name":"x-env","prefix":"pr"}]},"key":["path","method"],"algorithm":"sliding_log","limit":2,"window":"1m"}]}`
	var many strings.Builder
	many.WriteString(`{"policy":"q","rules":[{"id":"h","match":{"headers":[`)
	for i := 0; i < 10; i++ {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`{"name":"x-h` + strconv.Itoa(i) + `","absent":true}`)
	}
	many.WriteString(`]},"key":["header:x-api-key|path"],"algorithm":"gcra","limit":1,"window":"1s"}]}`)
	n := 300
	if testing.Short() {
		n = 50
	}
	for _, pol := range []string{few, many.String()} {
		e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
		rng := rand.New(rand.NewPCG(1, 2))
		ctx := context.Background()
		for i := 0; i < n; i++ {
			s, err := e.h.Worker(0).NewStream(host.StreamInfo{SourceAddress: randomAddr(rng)})
			if err != nil {
				t.Fatal(err)
			}
			st, err := s.RequestHeaders(ctx, randomHeaders(rng), true)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if st == host.Replied && s.LocalReply().Status != 429 {
				t.Fatalf("request %d: reply %d", i, s.LocalReply().Status)
			}
			if st == host.Continue {
				if _, err := s.ResponseHeaders(ctx, host.Headers{{":status", "200"}, {"x-cost", randomValue(rng)}}, true); err != nil {
					t.Fatalf("request %d response: %v", i, err)
				}
			}
			if err := s.Finish(ctx); err != nil {
				t.Fatalf("request %d finish: %v", i, err)
			}
		}
		if err := e.h.Worker(0).Failed(); err != nil {
			t.Fatalf("VM failed: %v", err)
		}
		for _, l := range e.h.Logs() {
			if l.Level >= host.LogError {
				t.Errorf("guest error log: %.3000s", l.Message)
			}
		}
		if r := e.do(0, req{path: "/a", headers: host.Headers{{"x-api-key", "ok"}, {"x-user-id", "u"}}}); r.Status != 200 && r.Status != 429 {
			t.Fatalf("after the hostile requests: %d", r.Status)
		}
	}
}

func randomAddr(rng *rand.Rand) string {
	switch rng.IntN(4) {
	case 0:
		return "[2001:db8::" + strconv.FormatUint(uint64(rng.Uint32()&0xffff), 16) + "]:443"
	case 1:
		return "garbage"
	default:
		return strconv.Itoa(rng.IntN(256)) + ".0.2." + strconv.Itoa(rng.IntN(256)) + ":1"
	}
}

var headerNames = []string{":method", ":path", ":authority", "x-api-key", "x-user-id", "x-tenant-id", "x-cost",
	"x-env", "x-forwarded-for", "x-request-id", "traceparent", "x-h3", "cookie", "x-other"}

func randomHeaders(rng *rand.Rand) host.Headers {
	var h host.Headers
	switch rng.IntN(10) {
	case 0: // thousands of headers
		for i := 0; i < 2000; i++ {
			h = append(h, [2]string{headerNames[rng.IntN(len(headerNames))], randomValue(rng)})
		}
	case 1: // one huge value
		h = append(h, [2]string{headerNames[rng.IntN(len(headerNames))], strings.Repeat("\xff\x00a|:%", 20000)})
	default:
		for i := rng.IntN(12); i > 0; i-- {
			h = append(h, [2]string{headerNames[rng.IntN(len(headerNames))], randomValue(rng)})
		}
	}
	return h // pseudo-headers only when drawn: often none
}

func randomValue(rng *rand.Rand) string {
	switch rng.IntN(6) {
	case 0:
		return ""
	case 1:
		return strconv.FormatUint(rng.Uint64()>>rng.IntN(64), 10)
	case 2:
		return "198.51.100." + strconv.Itoa(rng.IntN(300)) + ", " + strconv.Itoa(rng.IntN(300)) + ".1.1.1"
	case 3:
		return "00-" + strconv.FormatUint(rng.Uint64(), 16) + "-x"
	default:
		b := make([]byte, rng.IntN(64))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return string(b)
	}
}

// TestManyDistinctKeys: 100,000 distinct keys (a million in
// BenchmarkRequest/one_rule_1M_keys and BenchmarkLinearMemory) keep the
// rule's shared data at buckets_per_rule keys of one bucket size each, and
// the guest's memory does not grow after warm-up. Once every entry is live,
// the keys without one share each bucket's overflow state: one request per
// bucket (the limit) passes, the rest are limited and counted as overflow.
func TestManyDistinctKeys(t *testing.T) {
	buildWasm(t)
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	pol := `{"policy":"p","rules":[{"id":"k","key":["header:x-k"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","buckets_per_rule":32,"entries_per_bucket":8,"policy":`+pol+`}`, 1)
	var mid uint32
	admitted := 0
	for i := 0; i < n; i++ {
		if i == n*3/5 {
			mid = e.h.Worker(0).MemorySize()
		}
		r := e.do(0, req{path: "/", headers: host.Headers{{"x-k", strconv.Itoa(i)}}})
		switch r.Status {
		case 200:
			admitted++
		case 429:
		default:
			t.Fatalf("key %d: status %d", i, r.Status)
		}
	}
	if admitted != 32*8+32 {
		t.Errorf("admitted %d of %d new keys, want %d (every entry, then one per bucket's overflow)", admitted, n, 32*8+32)
	}
	pp, _ := rules.ParsePolicy([]byte(pol))
	comp, _ := rules.Compile(pp, rules.CompileOptions{})
	layout, _ := table.New(comp.Rule(0).Limiter, 8)
	for b := 0; b < 32; b++ {
		v, _, ok := e.h.SharedData(bucketKeyOf("p", "k", 8, 32, b))
		if !ok || len(v) != layout.Size() {
			t.Errorf("bucket %d: present %v, %d bytes, want %d", b, ok, len(v), layout.Size())
		}
	}
	if _, _, ok := e.h.SharedData(bucketKeyOf("p", "k", 8, 32, 32)); ok {
		t.Error("a 33rd bucket exists")
	}
	// The Go heap settles in a few steps over the first tens of thousands
	// of requests; after that, memory is flat (one 64 KiB page of slack).
	if end := e.h.Worker(0).MemorySize(); end > mid+64<<10 {
		t.Errorf("linear memory grew from %d to %d bytes over the last %d requests", mid, end, n-n*3/5)
	}
	if got := e.metric("sluice.bucket_overflow"); got != int64(n-32*8) {
		t.Errorf("sluice.bucket_overflow = %d, want %d", got, n-32*8)
	}
}
