package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestCostHeaders: a request cost from a header (validated, clamped to
// max_cost) and its correction from a response header.
func TestCostHeaders(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","rules":[{"id":"llm","key":["client_ip"],"algorithm":"token_bucket","limit":100,"window":"1000h",
	  "cost_header":"x-cost","max_cost":50,"response_cost_header":"x-used"}]}`
	e := newEnv(t, `{"tick":"1m","headers_on_allow":true,"policy":`+pol+`}`, 1)
	used := func(v string) func(host.UpstreamRequest) host.UpstreamResponse {
		return func(host.UpstreamRequest) host.UpstreamResponse {
			if v == "" {
				return host.UpstreamResponse{}
			}
			return host.UpstreamResponse{Headers: host.Headers{{"x-used", v}}}
		}
	}
	step := func(cost, usedV, wantRemaining string) {
		t.Helper()
		var hs host.Headers
		if cost != "" {
			hs = host.Headers{{"x-cost", cost}}
		}
		r := e.do(0, req{path: "/", headers: hs, upstream: used(usedV)})
		if r.Status != 200 {
			t.Fatalf("cost %q: %d", cost, r.Status)
		}
		wantHeaders(t, r.Headers, map[string]string{"x-ratelimit-remaining": wantRemaining})
	}
	step("10", "30", "90")     // charged 10, corrected to 30
	step("1", "", "69")        // 100-30-1
	step("abc", "", "68")      // malformed: the rule's cost (1), counted
	step("999", "0", "18")     // clamped to 50; corrected to the minimum cost 1, not refunded to 0: 67
	step("", "garbage", "66")  // 67-1; malformed response cost is counted, charge kept
	step("", "10000000", "65") // response cost clamped to max_cost 50: 65-49 = 16 after it
	step("", "", "15")
	if got := e.metric("sluice.cost_header_invalid"); got != 3 {
		t.Errorf("cost_header_invalid = %d, want 3 (abc, 999 clamped, garbage)", got)
	}
}

// TestZeroCostHeaderStillCounts: a cost header of 0 is not a free request.
// A request costs at least one unit, so a token bucket of 2 admits two
// such requests, and a concurrency rule with a cost header admits its
// limit of streams, not an unbounded number.
func TestZeroCostHeaderStillCounts(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","rules":[{"id":"tb","match":{"path_prefix":"/tb"},"key":["client_ip"],"algorithm":"token_bucket","limit":2,"window":"1000h",
	  "cost_header":"x-cost","max_cost":10}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	var got []int
	for i := 0; i < 3; i++ {
		got = append(got, e.do(0, req{path: "/tb", headers: host.Headers{{"x-cost", "0"}}}).Status)
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("token bucket of 2, cost header 0: %v, want [200 200 429]", got)
	}

	pol = `{"policy":"p","rules":[{"id":"cc","key":["client_ip"],"algorithm":"concurrency","limit":2,
	  "cost_header":"x-cost","max_cost":10}]}`
	e = newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	ctx := context.Background()
	var open []*host.Stream
	var statuses []string
	for i := 0; i < 3; i++ {
		s, err := e.h.Worker(0).NewStream(host.StreamInfo{SourceAddress: "203.0.113.9:1"})
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.RequestHeaders(ctx, host.Headers{{":method", "GET"}, {":path", "/"}, {"x-cost", "0"}}, true)
		if err != nil {
			t.Fatal(err)
		}
		if st == host.Replied {
			statuses = append(statuses, strconv.Itoa(s.LocalReply().Status))
		} else {
			statuses = append(statuses, st.String())
		}
		open = append(open, s) // held open: the slots stay taken
	}
	if statuses[0] != "Continue" || statuses[1] != "Continue" || statuses[2] != "503" {
		t.Errorf("concurrency 2, cost header 0, three open streams: %v, want [Continue Continue 503]", statuses)
	}
	for _, s := range open {
		if err := s.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
