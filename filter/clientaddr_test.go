package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// clientAddressCases are requests as Envoy hands them to the filter: the
// source.address its HTTP connection manager computed (the trusted client
// address; an address taken from X-Forwarded-For has port 0) and the
// X-Forwarded-For header the filters see, with what the client wrote on
// the left. wantKey is the client_ip key part source.address gives.
var clientAddressCases = []struct {
	name    string
	src     string
	xff     []string
	wantKey string
}{
	// Three clients behind one load balancer (10.0.0.9), Envoy with
	// use_remote_address and xff_num_trusted_hops 1: source.address is the
	// address the balancer appended; Envoy appended the balancer after it.
	{"behind a balancer: client 1", "198.51.100.1:0", []string{"198.51.100.1,10.0.0.9"}, "198.51.100.1"},
	{"behind a balancer: client 2", "198.51.100.2:0", []string{"198.51.100.2,10.0.0.9"}, "198.51.100.2"},
	{"behind a balancer: client 3", "198.51.100.3:0", []string{"198.51.100.3,10.0.0.9"}, "198.51.100.3"},
	// A client that forges X-Forwarded-For at every position, edge Envoy
	// (use_remote_address, no trusted hops): source.address is its peer.
	{"forged: one entry", "203.0.113.50:4242", []string{"192.0.2.1,203.0.113.50"}, "203.0.113.50"},
	{"forged: second from the right", "203.0.113.50:4242", []string{"192.0.2.1, 192.0.2.2,203.0.113.50"}, "203.0.113.50"},
	{"forged: many entries", "203.0.113.50:4242", []string{"192.0.2.1, 192.0.2.2, 192.0.2.3, 192.0.2.4,203.0.113.50"}, "203.0.113.50"},
	{"forged: repeated headers", "203.0.113.50:4242", []string{"192.0.2.1", "192.0.2.2", "192.0.2.3,203.0.113.50"}, "203.0.113.50"},
	{"forged: in place of the balancer's entry", "198.51.100.1:0", []string{"192.0.2.1,198.51.100.1,10.0.0.9"}, "198.51.100.1"},
	{"forged: garbage", "203.0.113.50:4242", []string{"not-an-ip, [::1]:80,203.0.113.50"}, "203.0.113.50"},
	{"no header", "203.0.113.51:1", nil, "203.0.113.51"},
	// IPv6, with and without the port Envoy's address string carries.
	{"ipv6 with port", "[2001:db8::7]:443", []string{"192.0.2.1,2001:db8::7"}, "2001%3Adb8%3A%3A7"},
	{"ipv6 from XFF (port 0)", "[2001:db8::8]:0", []string{"2001:db8::8,10.0.0.9"}, "2001%3Adb8%3A%3A8"},
	{"ipv6 without port", "2001:db8::9", nil, "2001%3Adb8%3A%3A9"},
	{"ipv4-mapped ipv6 is the ipv4 address", "[::ffff:198.51.100.4]:0", nil, "198.51.100.4"},
}

// TestClientKeyIsEnvoysClientAddress: under every configuration the filter
// accepts, the client_ip key is source.address, the trusted client address
// Envoy's HTTP connection manager computed (use_remote_address,
// xff_num_trusted_hops). X-Forwarded-For is not parsed a second time: a
// client that writes it at any position cannot choose its key, and clients
// behind one load balancer, which Envoy tells apart, get a key each.
func TestClientKeyIsEnvoysClientAddress(t *testing.T) {
	bin := buildWasm(t)
	pol := `{"policy":"p","rules":[{"id":"ip","key":["client_ip"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	configs := []string{`{"tick":"1m","policy":` + pol + `}`}
	for hops := 0; hops <= 16; hops++ {
		configs = append(configs, `{"tick":"1m","trusted_hops":`+strconv.Itoa(hops)+`,"policy":`+pol+`}`)
	}
	accepted := 0
	for _, cfg := range configs {
		h, err := host.New(context.Background(), host.Config{Wasm: bin, PluginConfig: []byte(cfg), NoCanary: true,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			continue // refused: Envoy would not run it
		}
		h.Close()
		accepted++
		t.Run(cfg[:strings.Index(cfg, `"policy"`)], func(t *testing.T) {
			e := newEnv(t, cfg, 1)
			for _, tc := range clientAddressCases {
				var hs host.Headers
				for _, v := range tc.xff {
					hs = append(hs, [2]string{"x-forwarded-for", v})
				}
				r := e.do(0, req{path: "/", src: tc.src, headers: hs})
				if strings.HasPrefix(tc.name, "behind a balancer") && r.Status != 200 {
					t.Errorf("%s: %d, want 200", tc.name, r.Status)
				}
				if got := filterstate.Fields(r.FilterState)["key"]; got != "rl:default:p/ip:ip="+tc.wantKey+":3600s" {
					t.Errorf("%s: key %q, want client %s", tc.name, got, tc.wantKey)
				}
			}
			// The three clients behind the balancer each passed once
			// (200 200 200, not 200 429 429): each has its own counter,
			// which a second request then finds spent.
			for i, tc := range clientAddressCases[:3] {
				if r := e.do(0, req{path: "/", src: tc.src, headers: host.Headers{{"x-forwarded-for", tc.xff[0]}}}); r.Status != 429 {
					t.Errorf("client %d again: %d, want 429", i+1, r.Status)
				}
			}
		})
	}
	if accepted == 0 {
		t.Fatal("no configuration accepted")
	}
}
