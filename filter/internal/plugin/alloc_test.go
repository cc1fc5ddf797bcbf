//go:build !wasip1

package plugin

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// allocPolicy: per user (else client IP) on /api/, a limit the allowed
// case never reaches; "tight" denies every request of user "flood" after
// its first; "other" matches only /other.
const allocPolicy = `{"policy":"alloc","version":1,"identity":{"user_header":"x-user-id"},"rules":[
 {"id":"api","match":{"path_prefix":"/api/"},"key":["user|client_ip"],"algorithm":"token_bucket","limit":1000000000000,"window":"1s"},
 {"id":"tight","match":{"path_prefix":"/tight/"},"key":["user"],"algorithm":"fixed_window","limit":1,"window":"1h"},
 {"id":"gcra","match":{"path_prefix":"/five/"},"key":["user"],"algorithm":"gcra","limit":1000000000,"window":"1s","burst":1000000000},
 {"id":"fw","match":{"path_prefix":"/five/"},"key":["user"],"algorithm":"fixed_window","limit":1000000000,"window":"1h"},
 {"id":"tw","match":{"path_prefix":"/five/"},"key":["user","path"],"algorithm":"time_wheel","limit":1000000000,"window":"1h","slots":60},
 {"id":"tb","match":{"path_prefix":"/five/"},"key":["user"],"algorithm":"token_bucket","limit":1000000000,"window":"1h"},
 {"id":"tb2","match":{"path_prefix":"/five/"},"key":["client_ip"],"algorithm":"token_bucket","limit":1000000000,"window":"1h"},
 {"id":"other","match":{"path_prefix":"/other"},"key":["client_ip"],"algorithm":"token_bucket","limit":1,"window":"1h"}]}`

// TestWarmRequestPathAllocatesNothing runs the plugin natively over the
// binding's emulator (the same hostcall wrappers and scratch as the .wasm)
// and counts Go heap allocations of whole streams (request headers,
// response headers, stream done) once warm: allowed, denied (a flood of
// 429s), a request no rule matches, and five matching rules. Each must
// allocate nothing.
func TestWarmRequestPathAllocatesNothing(t *testing.T) {
	e, err := proxywasm.NewEmulator(NewVMContext(), proxywasm.EmulatorOptions{
		PluginConfig: []byte(`{"tick":"1m","policy":` + allocPolicy + `}`),
		Properties:   map[string]string{"source.address": "203.0.113.7:443", "xds.node.id": "alloc-node", "plugin_name": "sluice"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	resp := [][2]string{{":status", "200"}}
	for _, tc := range []struct {
		name    string
		headers [][2]string
		status  uint32 // the local reply's, 0 for none
	}{
		{"allowed", [][2]string{{":method", "GET"}, {":path", "/api/x"}, {"x-user-id", "alice"}}, 0},
		{"denied", [][2]string{{":method", "GET"}, {":path", "/tight/x"}, {"x-user-id", "flood"}, {"x-request-id", "req-1"}}, 429},
		{"no_match", [][2]string{{":method", "GET"}, {":path", "/static/x"}, {"x-user-id", "alice"}}, 0},
		{"five_rules", [][2]string{{":method", "GET"}, {":path", "/five/x"}, {"x-user-id", "alice"}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got uint32
			stream := func() {
				id := e.NewStream()
				if e.RequestHeaders(id, tc.headers, true) == types.ActionContinue {
					e.ResponseHeaders(id, resp, true)
				}
				got, _, _, _ = e.LocalReply(id)
				e.StreamDone(id)
			}
			for range 200 { // warm: buckets, scratch, free lists
				stream()
			}
			if got != tc.status {
				t.Fatalf("local reply %d, want %d", got, tc.status)
			}
			const runs = 1000
			if n := proxywasm.LeastHeapAllocs(runs, stream); n != 0 {
				t.Errorf("%d heap allocations in %d warm streams, want 0", n, runs)
			}
			if got != tc.status {
				t.Fatalf("local reply %d, want %d", got, tc.status)
			}
		})
	}
}
