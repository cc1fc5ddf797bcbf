package main

import (
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestCostHeaders: a request cost from a header (validated, clamped to
// max_cost) and its correction from a response header.
func TestCostHeaders(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","rules":[{"id":"llm","key":["client_ip"],"algorithm":"token_bucket","limit":100,"window":"1000h",
	  "cost_header":"x-cost","max_cost":50,"response_cost_header":"x-used"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
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
	step("999", "0", "18")     // clamped to 50; refunded to 0
	step("", "garbage", "67")  // 68-1 after the refund; malformed response cost is counted, charge kept
	step("", "10000000", "66") // response cost clamped to max_cost 50: 67-50 = 17 after it
	step("", "", "16")
	if got := e.metric("sluice.cost_header_invalid"); got != 3 {
		t.Errorf("cost_header_invalid = %d, want 3 (abc, 999 clamped, garbage)", got)
	}
}
