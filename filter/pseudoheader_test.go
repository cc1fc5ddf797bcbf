package main

import (
	"strconv"
	"testing"
)

// TestPseudoHeaderMatchAndKey: a rule may match on, and key by, the
// ":method" and ":path" pseudo-headers (rules.ValidHeaderName accepts
// them); the filter must read them whether the policy names few headers
// (one proxy_get_header_map_value each) or many (the whole map at once).
func TestPseudoHeaderMatchAndKey(t *testing.T) {
	buildWasm(t)
	// extra header conditions push the policy past the filter's
	// one-header-at-a-time threshold.
	for _, extra := range []int{0, 9} {
		t.Run("extra headers "+strconv.Itoa(extra), func(t *testing.T) {
			match := `{"name":":method","exact":"POST"}`
			for i := 0; i < extra; i++ {
				match += `,{"name":"x-h` + strconv.Itoa(i) + `","absent":true}`
			}
			pol := `{"policy":"p","rules":[{"id":"post","match":{"headers":[` + match + `]},` +
				`"key":["header::path"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
			e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
			if r := e.do(0, req{method: "GET", path: "/a"}); r.Status != 200 {
				t.Fatalf("GET: %d", r.Status)
			}
			r := e.do(0, req{method: "POST", path: "/a?x=1"})
			if r.Status != 200 {
				t.Fatalf("first POST: %d", r.Status)
			}
			wantState(t, r.FilterState, map[string]string{"sluice.rule": "post"})
			if r := e.do(0, req{method: "POST", path: "/a?x=1"}); r.Status != 429 {
				t.Fatalf("second POST: %d, want 429", r.Status)
			}
		})
	}
}
