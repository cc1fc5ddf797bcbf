package main

import (
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestManyRequestHeadersCannotBypass: a policy naming more headers than
// the filter reads one at a time makes it read the whole request header
// map at once. Envoy serializes that map without the 1024-pair / 1 MiB
// limits it applies to maps coming from the guest (and allows more headers
// when max_headers_count is raised), so a client sending more than 1024
// headers must not make header-keyed rules stop counting.
func TestManyRequestHeadersCannotBypass(t *testing.T) {
	buildWasm(t)
	match := ``
	for i := 0; i < 9; i++ {
		if i > 0 {
			match += ","
		}
		match += `{"name":"x-h` + strconv.Itoa(i) + `","absent":true}`
	}
	pol := `{"policy":"p","rules":[{"id":"key","match":{"headers":[` + match + `]},` +
		`"key":["header:x-api-key"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	hs := host.Headers{{"x-api-key", "k1"}}
	if r := e.do(0, req{method: "GET", path: "/", headers: hs}); r.Status != 200 {
		t.Fatalf("first: %d", r.Status)
	}
	for i := 0; i < 1100; i++ {
		hs = append(hs, [2]string{"x-junk-" + strconv.Itoa(i), "v"})
	}
	r := e.do(0, req{method: "GET", path: "/", headers: hs})
	if r.Status != 429 {
		t.Fatalf("second, with 1100 extra headers: %d, want 429 (filter state %v)", r.Status, r.FilterState)
	}
}
