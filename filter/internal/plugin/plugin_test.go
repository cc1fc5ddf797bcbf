package plugin

import (
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// TestParseAddress: source.address as Envoy's Address::asString writes it
// ("ip:port", "[ipv6]:port"; port 0 for an address from X-Forwarded-For),
// IPv4-mapped IPv6 unmapped, anything else unknown.
func TestParseAddress(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7:443": "203.0.113.7", "198.51.100.1:0": "198.51.100.1", "[2001:db8::1]:0": "2001:db8::1",
		"[::ffff:192.0.2.1]:80": "192.0.2.1", "192.0.2.9": "192.0.2.9", "2001:db8::2": "2001:db8::2", "[2001:db8::3]": "2001:db8::3",
	} {
		if got := parseAddress(in); got != netip.MustParseAddr(want) {
			t.Errorf("parseAddress(%q) = %v, want %s", in, got, want)
		}
	}
	for _, in := range []string{"", "garbage", "1.2.3.4, 5.6.7.8", "/tmp/envoy.sock", "envoy://internal_listener/"} {
		if got := parseAddress(in); got.IsValid() {
			t.Errorf("parseAddress(%q) = %v, want unknown", in, got)
		}
	}
}

func TestTraceparentID(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	good := "00-" + id + "-00f067aa0ba902b7-01"
	if got, ok := traceparentID(good); !ok || got != id {
		t.Fatalf("traceparentID(%q) = %q, %v", good, got, ok)
	}
	if got, ok := traceparentID("01-" + id + "-00f067aa0ba902b7-01-future"); !ok || got != id {
		t.Fatalf("future version: %q, %v", got, ok)
	}
	for _, bad := range []string{
		"", "00-" + id + "-00f067aa0ba902b7-0", "ff-" + id + "-00f067aa0ba902b7-01",
		"00-" + "4BF92F3577B34DA6A3CE929D0E0E4736" + "-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-" + id + "-0000000000000000-01",
		good + "-extra", "00_" + id + "-00f067aa0ba902b7-01",
	} {
		if got, ok := traceparentID(bad); ok {
			t.Errorf("traceparentID(%q) = %q, want invalid", bad, got)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]uint64{
		0: 0, -time.Second: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 14500 * time.Millisecond: 15,
	} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func compile(t *testing.T, doc string) *rules.Compiled {
	t.Helper()
	p, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{Env: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSwapPolicy: the seam rule sync uses. Shared-data keys name the policy,
// rule and bucket layout (not the version), so an unchanged rule keeps its
// counters; metrics are kept per rule id while the rule exists; the request
// data read follows the rules.
func TestSwapPolicy(t *testing.T) {
	p := &pluginContext{cfg: config.Default()}
	p.cfg.BucketsPerRule = 3
	v1 := compile(t, `{"policy":"edge","version":1,"identity":{"user_header":"x-user","tenant_header":"x-tenant"},"rules":[
	  {"id":"a","key":["client_ip"],"algorithm":"gcra","limit":1,"window":"1s"}]}`)
	if err := p.swapPolicy(v1); err != nil {
		t.Fatal(err)
	}
	if v, ok := p.policyVersion(); !ok || v != 1 {
		t.Fatalf("version %d %v", v, ok)
	}
	ps := p.pol
	if want := []string{"sluice/edge/a/e16b3/0", "sluice/edge/a/e16b3/1", "sluice/edge/a/e16b3/2"}; !reflect.DeepEqual(ps.rules[0].keys, want) {
		t.Errorf("keys %q, want %q", ps.rules[0].keys, want)
	}
	// The client address is not read in either phase: the request asks
	// for it when the key part needs it (rules.Request.ClientIPSource).
	if !reflect.DeepEqual(ps.match, reads{}) || !reflect.DeepEqual(ps.key, reads{}) {
		t.Errorf("v1 reads %+v before matching, %+v after, want none", ps.match, ps.key)
	}
	ma := ps.rules[0].m
	v2 := compile(t, `{"policy":"edge","version":2,"identity":{"user_header":"x-user","tenant_header":"x-tenant"},"rules":[
	  {"id":"a","key":["client_ip"],"algorithm":"gcra","limit":1,"window":"1s"},
	  {"id":"b","match":{"path_prefix":"/x","methods":["GET"],"headers":[{"name":"x-env","exact":"p"}]},
	   "key":["user|tenant","header:x-k"],"algorithm":"fixed_window","limit":5,"window":"1m","cost_header":"x-cost","max_cost":3}]}`)
	if err := p.swapPolicy(v2); err != nil {
		t.Fatal(err)
	}
	ps = p.pol
	if ps.rules[0].m != ma {
		t.Error("rule a's metrics were redefined")
	}
	// Matching needs the method, the path and x-env; the keys and the cost
	// the rest, read only once a rule matched.
	if want := (reads{headerNames: []string{"x-env"}, method: true, path: true}); !reflect.DeepEqual(ps.match, want) || ps.allHeaders {
		t.Errorf("v2 reads %+v before matching, want %+v", ps.match, want)
	}
	got := append([]string(nil), ps.key.headerNames...)
	sort.Strings(got)
	if want := []string{"x-cost", "x-k", "x-tenant", "x-user"}; !reflect.DeepEqual(got, want) || !ps.key.user || !ps.key.tenant || ps.key.method || ps.key.path {
		t.Errorf("v2 reads %+v after matching, want headers %q, user and tenant", ps.key, want)
	}
	// A policy whose buckets would not fit is refused; the current one stays.
	p.cfg.EntriesPerBucket = 64
	big := compile(t, `{"policy":"edge","version":3,"rules":[{"id":"s","algorithm":"sliding_log","limit":64,"window":"1s"}]}`)
	if err := p.swapPolicy(big); err == nil {
		t.Fatal("oversized buckets accepted")
	}
	if v, _ := p.policyVersion(); v != 2 {
		t.Errorf("version after a refused swap: %d", v)
	}
	if p.retiring != nil {
		t.Errorf("retiring %+v after swaps that dropped no rule", p.retiring)
	}
	// Dropping rule b forgets its metrics (the tick no longer flushes them)
	// and notes it for retirement; rule a keeps its metrics.
	p.cfg.EntriesPerBucket = 16
	v4 := compile(t, `{"policy":"edge","version":4,"rules":[{"id":"a","key":["client_ip"],"algorithm":"gcra","limit":1,"window":"1s"}]}`)
	if err := p.swapPolicy(v4); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.ruleStats["b"]; ok || p.ruleStats["a"] != ma {
		t.Errorf("rule metrics after dropping b: %v", p.ruleStats)
	}
	if r := p.retiring; r == nil || r.policy != "edge" || r.version != 4 || !reflect.DeepEqual(r.ids, []string{"b"}) || r.ticks != retireTicks {
		t.Errorf("retiring %+v, want rule b of edge version 4", r)
	}
	// A rule that comes back before its retirement is kept.
	if err := p.swapPolicy(v2); err != nil {
		t.Fatal(err)
	}
	if p.retiring != nil {
		t.Errorf("retiring %+v after rule b came back", p.retiring)
	}
}
