package rules

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const descriptorPolicy = `{"policy":"edge","version":3,"rules":[
 {"id":"db-users","descriptor":{"domain":"mongo_cps","entries":[{"key":"database","value":"users"}]},
  "algorithm":"fixed_window","limit":500,"window":"1s","scope":"fleet"},
 {"id":"per-ip","descriptor":{"domain":"edge","entries":[{"key":"generic_key","value":"api"},{"key":"remote_address"}]},
  "algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
 {"id":"paths","descriptor":{"domain":"edge","entries":[{"key":"path","value":"/v1/*"}]},
  "algorithm":"token_bucket","limit":5,"window":"1s","scope":"fleet","shadow":true}
]}`

func TestADescriptorRuleRoundTripsAndIsKeyedByItsOpenEntries(t *testing.T) {
	p := mustParse(t, descriptorPolicy)
	want := &Descriptor{Domain: "edge", Entries: []DescriptorEntry{{Key: "generic_key", Value: "api"}, {Key: "remote_address"}}}
	if !reflect.DeepEqual(p.Rules[1].Descriptor, want) {
		t.Fatalf("descriptor: got %#v, want %#v", p.Rules[1].Descriptor, want)
	}
	again := mustParse(t, string(EncodePolicy(p)))
	if !reflect.DeepEqual(again, p) {
		t.Fatalf("round trip differs:\n%s", EncodePolicy(p))
	}
	c, err := Compile(p, CompileOptions{Env: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rule    int
		entries []Header
		key     string
	}{
		{0, []Header{{"database", "users"}}, "rl:prod:edge/db-users:*:1s"},
		{1, []Header{{"generic_key", "api"}, {"remote_address", "203.0.113.7"}}, "rl:prod:edge/per-ip:d.remote_address=203.0.113.7:60s"},
		{1, []Header{{"generic_key", "api"}, {"remote_address", "a|b=c"}}, "rl:prod:edge/per-ip:d.remote_address=a%7Cb%3Dc:60s"},
		{2, []Header{{"path", "/v1/x"}}, "rl:prod:edge/paths:d.path=/v1/x:1s"},
	} {
		got, ok := c.AppendKey(nil, tc.rule, &Request{Descriptor: tc.entries})
		if !ok || string(got) != tc.key {
			t.Errorf("rule %d %v: key %q %v, want %q", tc.rule, tc.entries, got, ok, tc.key)
		}
	}
	if _, ok := c.AppendKey(nil, 1, &Request{Descriptor: []Header{{"generic_key", "api"}}}); ok {
		t.Error("a descriptor without the open entry's value got a key")
	}
	// No HTTP request matches a descriptor rule, whatever it carries.
	req := &Request{Method: "GET", Path: "/v1/x", Headers: []Header{{"database", "users"}}}
	if got := c.Match(req, nil); len(got) != 0 {
		t.Fatalf("HTTP request matched descriptor rules %v", got)
	}
}

// An HTTP descriptor rule counts a descriptor and a request of the same user
// on one key, and still matches requests by its match.
func TestAnHTTPDescriptorRuleSharesItsKeyWithRequests(t *testing.T) {
	p := mustParse(t, `{"policy":"shared","identity":{"user_header":"x-user-id"},"rules":[
	 {"id":"api","match":{"path_prefix":"/api/"},"key":["user","header:x-plan","route"],"algorithm":"fixed_window","limit":9,"window":"1m","scope":"fleet",
	  "descriptor":{"domain":"edge","http":true,"entries":[{"key":"generic_key","value":"api"},{"key":"uid","key_part":"user"},{"key":"plan","key_part":"header:x-plan"}]}}]}`)
	if again := mustParse(t, string(EncodePolicy(p))); !reflect.DeepEqual(again, p) {
		t.Fatalf("round trip differs:\n%s", EncodePolicy(p))
	}
	c, err := Compile(p, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	http := &Request{Method: "GET", Path: "/api/x", Headers: []Header{{"x-user-id", "alice"}, {"x-plan", "gold"}}}
	if got := c.Match(http, nil); len(got) != 1 {
		t.Fatalf("the request matched %v", got)
	}
	want, _ := c.AppendKey(nil, 0, http)
	req, ok := p.Rules[0].Descriptor.Request([]Header{{"generic_key", "api"}, {"uid", "alice"}, {"plan", "gold"}})
	got, found := c.AppendKey(nil, 0, &req)
	if !ok || !found || string(got) != string(want) {
		t.Fatalf("descriptor key %q, request key %q", got, want)
	}
	if c.Match(&Request{Path: "/other"}, nil) != nil {
		t.Fatal("the match is not applied")
	}
}

// An unlimited descriptor rule has no limit parameters and compiles; replaces
// round-trips.
func TestUnlimitedAndReplacingDescriptorRulesParse(t *testing.T) {
	p := mustParse(t, `{"policy":"u","rules":[
	 {"id":"a","descriptor":{"domain":"d","entries":[{"key":"k","value":"v"}],"unlimited":true}},
	 {"id":"b","descriptor":{"domain":"d","entries":[{"key":"k"}],"replaces":["a"]},"algorithm":"fixed_window","limit":1,"window":"1s","scope":"fleet"}]}`)
	if again := mustParse(t, string(EncodePolicy(p))); !reflect.DeepEqual(again, p) {
		t.Fatalf("round trip differs:\n%s", EncodePolicy(p))
	}
	c, err := Compile(p, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Match(&Request{Path: "/"}, nil) != nil {
		t.Fatal("an HTTP request matched a descriptor rule")
	}
}

func TestADescriptorEntryAcceptsItsValue(t *testing.T) {
	for _, tc := range []struct {
		value, v string
		accepts  bool
		spec     int
	}{
		{"", "anything", true, 0},
		{"", "", true, 0},
		{"users", "users", true, 2},
		{"users", "users2", false, 2},
		{"/v1/*", "/v1/", true, 1},
		{"/v1/*", "/v1/a/b", true, 1},
		{"/v1/*", "/v2/a", false, 1},
		{"*", "", true, 1},
		{"a*b", "a*b", true, 2}, // only a last '*' is a wildcard
		{"a*b", "aab", false, 2},
	} {
		e := DescriptorEntry{Key: "k", Value: tc.value}
		if got := e.Accepts(tc.v); got != tc.accepts {
			t.Errorf("value %q accepts %q = %v, want %v", tc.value, tc.v, got, tc.accepts)
		}
		if got := e.Specificity(); got != tc.spec {
			t.Errorf("value %q specificity %d, want %d", tc.value, got, tc.spec)
		}
	}
}

func TestABadDescriptorRuleNamesTheField(t *testing.T) {
	for _, tc := range []struct{ rule, field, msg string }{
		{`"descriptor":{"entries":[{"key":"k"}]},"scope":"fleet"`, "rules[0].descriptor.domain", "required"},
		{`"descriptor":{"domain":"d","entries":[]},"scope":"fleet"`, "rules[0].descriptor.entries", "at least one"},
		{`"descriptor":{"domain":"d"},"scope":"fleet"`, "rules[0].descriptor.entries", "at least one"},
		{`"descriptor":{"domain":"d","entries":[{"value":"v"}]},"scope":"fleet"`, "rules[0].descriptor.entries[0].key", "required"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k","value":""}]},"scope":"fleet"`, "rules[0].descriptor.entries[0].value", "must not be empty"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k","value":"a*b","shared":true}]},"scope":"fleet"`, "rules[0].descriptor.entries[0].shared", "only with a value ending in '*'"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}],"no_limit":true,"unlimited":true}`, "rules[0].descriptor.no_limit", "not with unlimited"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}],"no_limit":true}`, "rules[0]", "an unlimited or no_limit descriptor rule has only id"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k","nope":1}]},"scope":"fleet"`, "rules[0].descriptor.entries[0].nope", "unknown"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}]}`, "rules[0].scope", `must be "fleet"`},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}]},"scope":"fleet","key":["user"]`, "rules[0].key", "not with descriptor"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}]},"scope":"fleet","match":{"path":"/x"}`, "rules[0].match", "not with descriptor"},
		{`"descriptor":{"domain":"` + strings.Repeat("d", MaxDescriptorBytes+1) + `","entries":[{"key":"k"}]},"scope":"fleet"`, "rules[0].descriptor.domain", "at most"},
		{`"descriptor":{"domain":"d","entries":[` + strings.Repeat(`{"key":"k"},`, MaxDescriptorEntries) + `{"key":"k"}]},"scope":"fleet"`, "rules[0].descriptor.entries", "at most"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k","key_part":"user"}]},"scope":"fleet"`, "rules[0].descriptor.entries[0].key_part", `only with "http": true`},
		{`"descriptor":{"domain":"d","http":true,"entries":[{"key":"k"}]},"scope":"fleet","key":["header:k"]`, "rules[0].descriptor.entries[0].key_part", "required"},
		{`"descriptor":{"domain":"d","http":true,"entries":[{"key":"k","key_part":"header:j"}]},"scope":"fleet","key":["header:k"]`, "rules[0].descriptor.entries[0].key_part", "must be an element"},
		{`"descriptor":{"domain":"d","http":true,"entries":[{"key":"k","value":"v"}]},"scope":"fleet","key":["header:k"]`, "rules[0].key[0]", "no descriptor entry fills it"},
		{`"descriptor":{"domain":"d","http":true,"entries":[{"key":"k","key_part":"header:k"},{"key":"j","key_part":"header:k"}]},"scope":"fleet","key":["header:k"]`, "rules[0].descriptor.entries[1].key_part", "a second time"},
		{`"descriptor":{"domain":"d","http":true,"entries":[{"key":"k","key_part":"user|client_ip"}]},"scope":"fleet","key":["user|client_ip"]`, "rules[0].descriptor.entries[0].key_part", "one alternative"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}],"unlimited":true}`, "rules[0]", "an unlimited or no_limit descriptor rule has only id"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}],"replaces":["r"]},"scope":"fleet"`, "rules[0].descriptor.replaces[0]", "does not replace itself"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}],"replaces":["nope"]},"scope":"fleet"`, "rules[0].descriptor.replaces[0]", "must be the id of a descriptor rule"},
		{`"descriptor":{"domain":"d","entries":[{"key":"k"}]},"scope":"fleet"},{"id":"s","algorithm":"gcra","limit":5,"window":"1s","descriptor":{"domain":"d","entries":[{"key":"k"}]},"scope":"fleet"`, "rules[1].descriptor", "the same domain and entries as rules[0]"},
	} {
		doc := `{"policy":"p","rules":[{"id":"r","algorithm":"fixed_window","limit":5,"window":"1s",` + tc.rule + `}]}`
		_, err := ParsePolicy([]byte(doc))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Errorf("%s: err %v, want Errors", tc.rule, err)
			continue
		}
		found := false
		for _, e := range errs {
			if e.Field == tc.field && strings.Contains(e.Message, tc.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: got %v, want %s: ...%s...", tc.rule, errs, tc.field, tc.msg)
		}
	}
}

func TestALimitOfZeroIsADescriptorAlwaysOverItsLimit(t *testing.T) {
	ok := `{"policy":"p","rules":[{"id":"r","algorithm":"fixed_window","limit":0,"window":"1m","scope":"fleet","descriptor":{"domain":"d","entries":[{"key":"k","value":"banned"}]}}]}`
	if _, err := ParsePolicy([]byte(ok)); err != nil {
		t.Fatalf("a fixed_window descriptor rule of limit 0: %v", err)
	}
	for _, doc := range []string{
		`{"policy":"p","rules":[{"id":"r","algorithm":"gcra","limit":0,"window":"1m","scope":"fleet","descriptor":{"domain":"d","entries":[{"key":"k"}]}}]}`,
		`{"policy":"p","rules":[{"id":"r","algorithm":"fixed_window","limit":0,"window":"1m","scope":"fleet","key":["user"],"descriptor":{"domain":"d","http":true,"entries":[{"key":"k","key_part":"user"}]}}]}`,
		`{"policy":"p","rules":[{"id":"r","algorithm":"fixed_window","limit":0,"window":"1m","scope":"fleet"}]}`,
	} {
		_, err := ParsePolicy([]byte(doc))
		var errs Errors
		if !errors.As(err, &errs) || !strings.Contains(err.Error(), "limit") {
			t.Errorf("%s: err %v, want an error naming the limit", doc, err)
		}
	}
}
