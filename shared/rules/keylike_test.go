package rules

import (
	"net/netip"
	"testing"
)

// TestAKeyBuiltLikeAnotherRulesIsTheKeyItsOwnPartsBuild checks SameKeyParts
// against what AppendKey builds: for every pair of rules that SameKeyParts
// says share their parts, AppendKeyLike from the other rule's key must equal
// AppendKey, for requests with and without values, escapes and a client
// address; and the pairs whose parts differ (a header of another name,
// alternatives in another order, the route of another path, fewer parts)
// must not be said to share them.
func TestAKeyBuiltLikeAnotherRulesIsTheKeyItsOwnPartsBuild(t *testing.T) {
	c := mustCompile(t, `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[
		{"id":"sec","key":["user","header:x-org"],"algorithm":"gcra","limit":10,"window":"1s"},
		{"id":"hour","key":["user","header:x-org"],"algorithm":"fixed_window","limit":1000,"window":"1h"},
		{"id":"other-header","key":["user","header:x-team"],"algorithm":"gcra","limit":10,"window":"1s"},
		{"id":"swapped","key":["header:x-org","user"],"algorithm":"gcra","limit":10,"window":"1s"},
		{"id":"user-or-ip","key":["user|client_ip"],"algorithm":"token_bucket","limit":10,"window":"1m"},
		{"id":"user-or-ip-day","key":["user|client_ip"],"algorithm":"fixed_window","limit":100,"window":"24h"},
		{"id":"ip-or-user","key":["client_ip|user"],"algorithm":"token_bucket","limit":10,"window":"1m"},
		{"id":"route-a","match":{"path_prefix":"/a/"},"key":["route","user"],"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"route-a-min","match":{"path_prefix":"/a/"},"key":["route","user"],"algorithm":"gcra","limit":30,"window":"1m"},
		{"id":"route-b","match":{"path_prefix":"/b/"},"key":["route","user"],"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"user","key":["user"],"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"global","algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"global-min","algorithm":"gcra","limit":60,"window":"1m"}
	]}`, "e")
	same := map[[2]string]bool{
		{"sec", "hour"}: true, {"user-or-ip", "user-or-ip-day"}: true, {"route-a", "route-a-min"}: true,
	}
	reqs := []Request{
		{Path: "/a/x", Headers: hdrs("x-user-id", "alice", "x-org", "acme", "x-team", "t1")},
		{Path: "/b/x", Headers: hdrs("x-user-id", "b|ob=%:", "x-org", "ex ample\x00")},
		{Path: "/a/y", Headers: hdrs("x-org", "acme"), ClientIP: netip.MustParseAddr("2001:db8::7")},
		{Path: "/"},
	}
	n := c.Len()
	for i := range n {
		for j := range n {
			a, b := c.Rule(i).ID, c.Rule(j).ID
			want := i == j && len(c.Rule(i).Rule.Key) > 0 || same[[2]string{a, b}] || same[[2]string{b, a}]
			if got := c.SameKeyParts(i, j); got != want {
				t.Errorf("SameKeyParts(%s, %s) = %v, want %v", a, b, got, want)
			}
			if !want {
				continue
			}
			for r := range reqs {
				other, ok := c.AppendKey([]byte("before"), j, &reqs[r])
				own, ownOK := c.AppendKey(nil, i, &reqs[r])
				if ok != ownOK {
					t.Fatalf("request %d: rule %s builds a key: %v, rule %s: %v", r, b, ok, a, ownOK)
				}
				if !ok {
					continue
				}
				got := c.AppendKeyLike([]byte("x"), i, other[len("before"):], j)
				if string(got) != "x"+string(own) {
					t.Errorf("request %d: AppendKeyLike(%s from %s) = %q, want %q", r, a, b, got[1:], own)
				}
			}
		}
	}
}
