package rules

import (
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t testing.TB, doc string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatalf("ParsePolicy: %v\n%s", err, doc)
	}
	return p
}

func TestParseExample(t *testing.T) {
	p := mustParse(t, string(readFile(t, "testdata/example.json")))
	want := &Policy{
		Name:     "default",
		Version:  7,
		Identity: Identity{UserHeader: "x-user-id", TenantHeader: "x-tenant-id"},
		Exempt:   Exempt{CIDRs: []string{"10.0.0.0/8"}, Users: []string{"ops-bot"}},
		Rules: []Rule{{
			ID:          "login-per-ip",
			Description: "brute-force guard on login",
			Match: Match{
				PathPrefix: "/v1/auth/login",
				Methods:    []string{"POST"},
				Headers:    []HeaderMatch{{Name: "x-env", Exact: "prod"}},
			},
			Key:       []string{"client_ip"},
			Algorithm: "time_wheel",
			Limit:     10,
			Window:    5 * time.Minute,
			Slots:     30,
		}},
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("got  %#v\nwant %#v", p, want)
	}
	const canonical = `{"policy":"default","version":7,"identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"exempt":{"cidrs":["10.0.0.0/8"],"users":["ops-bot"]},"rules":[{"id":"login-per-ip","description":"brute-force guard on login","match":{"path_prefix":"/v1/auth/login","methods":["POST"],"headers":[{"name":"x-env","exact":"prod"}]},"key":["client_ip"],"algorithm":"time_wheel","limit":10,"window":"5m","slots":30}]}`
	if got := string(EncodePolicy(p)); got != canonical {
		t.Fatalf("EncodePolicy:\ngot  %s\nwant %s", got, canonical)
	}
}

// roundTrip checks that p encodes, parses back to p, and encodes to the same bytes.
func roundTrip(t testing.TB, p *Policy) {
	t.Helper()
	enc := EncodePolicy(p)
	q, err := ParsePolicy(enc)
	if err != nil {
		t.Fatalf("ParsePolicy(EncodePolicy(p)): %v\n%s", err, enc)
	}
	if !reflect.DeepEqual(p, q) {
		t.Fatalf("round trip changed the policy:\nbefore %#v\nafter  %#v\n%s", p, q, enc)
	}
	if enc2 := EncodePolicy(q); string(enc2) != string(enc) {
		t.Fatalf("encoding not stable:\n%s\n%s", enc, enc2)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, name := range []string{"testdata/example.json", "testdata/full.json"} {
		t.Run(name, func(t *testing.T) {
			roundTrip(t, mustParse(t, string(readFile(t, name))))
		})
	}
}

func TestParseRuleRoundTrip(t *testing.T) {
	p := mustParse(t, string(readFile(t, "testdata/full.json")))
	for i := range p.Rules {
		r := &p.Rules[i]
		got, err := ParseRule(EncodeRule(r), "")
		if err != nil {
			t.Fatalf("ParseRule(EncodeRule(%s)): %v", r.ID, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("rule %s: got %#v want %#v", r.ID, got, r)
		}
	}
}

// policyWith wraps rule JSON objects in a minimal valid policy.
func policyWith(rules ...string) string {
	return `{"policy":"p","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"rules":[` + strings.Join(rules, ",") + `]}`
}

const okRule = `"id":"r","algorithm":"fixed_window","limit":10,"window":"1m"`

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		// check inspects the first rule, when set.
		check func(t *testing.T, p *Policy)
	}{
		{name: "no rules", doc: `{"policy":"p","rules":[]}`},
		{name: "rules absent", doc: `{"policy":"p"}`},
		{name: "nulls mean absent", doc: `{"policy":"p","version":null,"identity":null,"exempt":null,"rules":[{` + okRule + `,"match":null,"key":null,"cost":null,"shadow":null}]}`},
		{name: "response headers, denials only", doc: `{"policy":"p","response_headers":{"set":"ratelimit"}}`, check: func(t *testing.T, p *Policy) {
			if want := (ResponseHeaders{Set: HeadersRateLimit}); p.ResponseHeaders == nil || *p.ResponseHeaders != want {
				t.Errorf("ResponseHeaders = %#v, want %#v", p.ResponseHeaders, want)
			}
		}},
		{name: "response headers null", doc: `{"policy":"p","response_headers":null}`, check: func(t *testing.T, p *Policy) {
			if p.ResponseHeaders != nil {
				t.Errorf("ResponseHeaders = %#v, want nil", p.ResponseHeaders)
			}
		}},
		{name: "whitespace everywhere", doc: " \t\r\n{ \"policy\" : \"p\" , \"rules\" : [ ] } \n"},
		{name: "global key", doc: policyWith(`{` + okRule + `,"key":[]}`), check: func(t *testing.T, p *Policy) {
			if p.Rules[0].Key != nil {
				t.Errorf("Key = %#v, want nil", p.Rules[0].Key)
			}
		}},
		{name: "fallback key", doc: policyWith(`{` + okRule + `,"key":["user|tenant|client_ip","header:x-a|method"]}`)},
		{name: "all key parts", doc: policyWith(`{` + okRule + `,"key":["client_ip","user","tenant","route","method","path","header:x-a","header::authority"]}`)},
		{name: "calendar day Berlin", doc: policyWith(`{"id":"d","algorithm":"fixed_window","limit":5,"align":"calendar_day","timezone":"Europe/Berlin"}`)},
		{name: "calendar day 24h UTC", doc: policyWith(`{"id":"d","algorithm":"fixed_window","limit":5,"window":"24h","align":"calendar_day","timezone":"UTC"}`)},
		{name: "concurrency defaults", doc: policyWith(`{"id":"c","algorithm":"concurrency","limit":3}`)},
		{name: "status bounds", doc: policyWith(`{`+okRule+`,"status":400}`, `{"id":"s","algorithm":"gcra","limit":1,"window":"1s","status":599}`)},
		{name: "cost header", doc: policyWith(`{` + okRule + `,"cost_header":"x-cost","max_cost":1099511627776}`), check: func(t *testing.T, p *Policy) {
			if p.Rules[0].MaxCost != 1<<40 {
				t.Errorf("MaxCost = %d", p.Rules[0].MaxCost)
			}
		}},
		{name: "escaped strings", doc: `{"policy":"p","rules":[{"id":"r","description":"a\"b\\c\/d\n\u00e9\ud83d\ude00","algorithm":"gcra","limit":1,"window":"1s"}]}`, check: func(t *testing.T, p *Policy) {
			if got, want := p.Rules[0].Description, "a\"b\\c/d\né😀"; got != want {
				t.Errorf("Description = %q, want %q", got, want)
			}
		}},
		{name: "ipv6 and single address exempt", doc: `{"policy":"p","exempt":{"cidrs":["::1","2001:db8::/32","192.0.2.1"]},"rules":[]}`},
		{name: "max rules", doc: policyWith(manyRules(MaxRules)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.doc)
			if tt.check != nil {
				tt.check(t, p)
			}
			roundTrip(t, p)
		})
	}
}

func manyRules(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = `{"id":"r` + strconv.Itoa(i) + `","algorithm":"gcra","limit":1,"window":"1s"}`
	}
	return out
}

// TestParseRejects lists every rejection with its exact error.
func TestParseRejects(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := []struct {
		name string
		doc  string
		want string
	}{
		// Malformed documents.
		{"empty", ``, `unexpected end of input, expected a value`},
		{"not an object", `[]`, `must be an object`},
		{"trailing garbage", `{"policy":"p"} x`, `unexpected data after the top-level value`},
		{"two values", `{"policy":"p"}{}`, `unexpected data after the top-level value`},
		{"trailing comma", `{"policy":"p","rules":[{"id":"a",}]}`, `rules[0]: expected a string (an object key)`},
		{"duplicate key", `{"policy":"p","policy":"q"}`, `policy: duplicate key`},
		{"invalid utf8", "{\"policy\":\"p\xff\"}", `policy: invalid UTF-8 in a string`},
		{"lone surrogate", `{"policy":"\ud800"}`, `policy: invalid \u escape: unpaired surrogate`},
		{"control char", "{\"policy\":\"a\tb\"}", `policy: control character 0x9 in a string must be escaped`},
		{"bom", "\xef\xbb\xbf{}", `invalid character 0xef at the start of a value`},
		{"single quotes", `{'policy':'p'}`, `expected a string (an object key)`},
		{"too deep", `{"policy":"p","rules":[{"match":{"headers":[{"name":[[[[[[[[[[[[]]]]]]]]]]]]}]}}]}`, `rules[0].match.headers[0].name[0][0][0][0][0][0][0][0][0][0]: nesting deeper than 16 levels`},
		{"too large", `{"policy":"` + strings.Repeat("a", MaxPolicyBytes) + `"}`, `document is 1048589 bytes, more than the limit of 1048576`},
		{"leading zero", `{"policy":"p","version":01}`, `version: invalid number`},
		// Types and ranges.
		{"unknown top field", `{"policy":"p","rulez":[]}`, `rulez: unknown field`},
		{"unknown rule field", policyWith(`{` + okRule + `,"foo":1}`), `rules[0].foo: unknown field`},
		{"unknown null field", policyWith(`{` + okRule + `,"foo":null}`), `rules[0].foo: unknown field`},
		{"unknown match field", policyWith(`{` + okRule + `,"match":{"host":"x"}}`), `rules[0].match.host: unknown field`},
		{"unknown header field", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"a","regex":"x"}]}}`), `rules[0].match.headers[0].regex: unknown field; rules[0].match.headers[0]: needs exactly one of exact, prefix, present: true, absent: true`},
		{"unknown exempt field", `{"policy":"p","exempt":{"ips":[]}}`, `exempt.ips: unknown field`},
		{"unknown identity field", `{"policy":"p","identity":{"user":"x"}}`, `identity.user: unknown field`},
		{"unknown response_headers field", `{"policy":"p","response_headers":{"set":"none","allowed":true}}`, `response_headers.allowed: unknown field`},
		{"response_headers without set", `{"policy":"p","response_headers":{"on_allow":true}}`, `response_headers.set: required`},
		{"response_headers set unknown", `{"policy":"p","response_headers":{"set":"X-RateLimit"}}`, `response_headers.set: must be one of x-ratelimit, ratelimit, both, none; got "X-RateLimit"`},
		{"response_headers on_allow not a bool", `{"policy":"p","response_headers":{"set":"none","on_allow":1}}`, `response_headers.on_allow: must be true or false`},
		{"version negative", `{"policy":"p","version":-1}`, `version: must be a non-negative integer`},
		{"version fraction", `{"policy":"p","version":1.5}`, `version: must be an integer`},
		{"version exponent", `{"policy":"p","version":1e3}`, `version: must be an integer`},
		{"version overflow", `{"policy":"p","version":18446744073709551616}`, `version: must be at most 18446744073709551615`},
		{"version string", `{"policy":"p","version":"7"}`, `version: must be a non-negative integer`},
		{"name number", `{"policy":1}`, `policy: must be a string`},
		{"rules object", `{"policy":"p","rules":{}}`, `rules: must be an array`},
		{"rule not object", `{"policy":"p","rules":[1]}`, `rules[0]: must be an object`},
		{"limit string", policyWith(`{"id":"r","algorithm":"gcra","limit":"10","window":"1s"}`), `rules[0].limit: must be an integer > 0`},
		{"negative limit", policyWith(`{"id":"r","algorithm":"gcra","limit":-5,"window":"1s"}`), `rules[0].limit: must be > 0`},
		{"window number", policyWith(`{"id":"r","algorithm":"gcra","limit":10,"window":60}`), `rules[0].window: must be a duration string such as "5m" or "1.5s"`},
		{"window bad unit", policyWith(`{"id":"r","algorithm":"gcra","limit":10,"window":"5 minutes"}`), `rules[0].window: must be a duration string such as "5m" or "1.5s"`},
		{"shadow string", policyWith(`{` + okRule + `,"shadow":"yes"}`), `rules[0].shadow: must be true or false`},
		{"key string", policyWith(`{` + okRule + `,"key":"client_ip"}`), `rules[0].key: must be an array`},
		{"key element number", policyWith(`{` + okRule + `,"key":[1]}`), `rules[0].key[0]: must be a string`},
		{"slots too big for uint32", policyWith(`{"id":"r","algorithm":"time_wheel","limit":10,"window":"1m","slots":4294967296}`), `rules[0].slots: must be <= ` + strconv.FormatUint(uint64(limit.MaxSlots), 10) + `, got 4294967296`},
		// Policy.
		{"no name", `{"rules":[]}`, `policy: required`},
		{"bad name", `{"policy":"Default"}`, `policy: ` + identRule},
		{"name leading dash", `{"policy":"-x"}`, `policy: ` + identRule},
		{"name too long", `{"policy":"` + long + `"}`, `policy: ` + identRule},
		{"name with slash", `{"policy":"a/b"}`, `policy: ` + identRule},
		{"bad user header", `{"policy":"p","identity":{"user_header":"X-User"}}`, `identity.user_header: ` + headerNameRule},
		{"bad tenant header", `{"policy":"p","identity":{"tenant_header":"x tenant"}}`, `identity.tenant_header: ` + headerNameRule},
		{"too many rules", policyWith(manyRules(MaxRules + 1)...), `rules: at most 256 rules, got 257`},
		{"duplicate id", policyWith(`{`+okRule+`}`, `{`+okRule+`}`), `rules[1].id: duplicate rule id "r" (also rules[0])`},
		// Exemptions.
		{"bad cidr", `{"policy":"p","exempt":{"cidrs":["10.0.0.0/33"]}}`, `exempt.cidrs[0]: must be an IP prefix such as 10.0.0.0/8 or an IP address`},
		{"cidr garbage", `{"policy":"p","exempt":{"cidrs":["localhost"]}}`, `exempt.cidrs[0]: must be an IP prefix such as 10.0.0.0/8 or an IP address`},
		{"cidr host bits", `{"policy":"p","exempt":{"cidrs":["10.0.0.1/8"]}}`, `exempt.cidrs[0]: has bits set beyond the prefix length; write 10.0.0.0/8`},
		{"cidr zone", `{"policy":"p","exempt":{"cidrs":["fe80::1%eth0"]}}`, `exempt.cidrs[0]: must be an IP prefix such as 10.0.0.0/8 or an IP address`},
		{"empty user", `{"policy":"p","exempt":{"users":[""]}}`, `exempt.users[0]: must be 1 to 256 bytes of UTF-8`},
		{"long tenant", `{"policy":"p","exempt":{"tenants":["` + strings.Repeat("t", 257) + `"]}}`, `exempt.tenants[0]: must be 1 to 256 bytes of UTF-8`},
		{"too many exempt users", `{"policy":"p","exempt":{"users":[` + strings.Repeat(`"u",`, MaxExemptEntries) + `"u"]}}`, `exempt.users: at most 256 entries, got 257`},
		{"too many exempt cidrs", `{"policy":"p","exempt":{"cidrs":[` + strings.Repeat(`"::1",`, MaxExemptEntries) + `"::1"]}}`, `exempt.cidrs: at most 256 entries, got 257`},
		{"rule exempt bad cidr", policyWith(`{` + okRule + `,"exempt":{"cidrs":["x"]}}`), `rules[0].exempt.cidrs[0]: must be an IP prefix such as 10.0.0.0/8 or an IP address`},
		// Rule id and description.
		{"no id", policyWith(`{"algorithm":"gcra","limit":1,"window":"1s"}`), `rules[0].id: required`},
		{"bad id", policyWith(`{"id":"Login","algorithm":"gcra","limit":1,"window":"1s"}`), `rules[0].id: ` + identRule},
		{"id too long", policyWith(`{"id":"` + long + `","algorithm":"gcra","limit":1,"window":"1s"}`), `rules[0].id: ` + identRule},
		{"long description", policyWith(`{` + okRule + `,"description":"` + strings.Repeat("d", MaxDescriptionBytes+1) + `"}`), `rules[0].description: must be at most 1024 bytes of UTF-8`},
		// Match.
		{"path and prefix", policyWith(`{` + okRule + `,"match":{"path":"/a","path_prefix":"/b"}}`), `rules[0].match.path_prefix: not allowed with path (use one of them)`},
		{"path relative", policyWith(`{` + okRule + `,"match":{"path":"a"}}`), `rules[0].match.path: must start with '/'`},
		{"path empty", policyWith(`{` + okRule + `,"match":{"path":""}}`), `rules[0].match.path: must not be empty (omit it to match every path)`},
		{"prefix empty", policyWith(`{` + okRule + `,"match":{"path_prefix":""}}`), `rules[0].match.path_prefix: must not be empty (omit it to match every path)`},
		{"path query", policyWith(`{` + okRule + `,"match":{"path_prefix":"/a?b=1"}}`), `rules[0].match.path_prefix: must not contain a query or fragment ('?', '#'): paths are matched without the query`},
		{"path space", policyWith(`{` + okRule + `,"match":{"path":"/a b"}}`), `rules[0].match.path: must not contain spaces or control characters`},
		{"path too long", policyWith(`{` + okRule + `,"match":{"path":"/` + strings.Repeat("p", MaxPathBytes) + `"}}`), `rules[0].match.path: must be at most 1024 bytes`},
		{"lower-case method", policyWith(`{` + okRule + `,"match":{"methods":["post"]}}`), `rules[0].match.methods[0]: must be an upper-case HTTP method such as GET (RFC 9110 §9, case-sensitive)`},
		{"method with space", policyWith(`{` + okRule + `,"match":{"methods":["GET "]}}`), `rules[0].match.methods[0]: must be an upper-case HTTP method such as GET (RFC 9110 §9, case-sensitive)`},
		{"duplicate method", policyWith(`{` + okRule + `,"match":{"methods":["GET","GET"]}}`), `rules[0].match.methods[1]: duplicate method "GET"`},
		{"too many methods", policyWith(`{` + okRule + `,"match":{"methods":["A","B","C","D","E","F","G","H","I","J","K","L","M","N","O","P","Q"]}}`), `rules[0].match.methods: at most 16 methods, got 17`},
		{"header no name", policyWith(`{` + okRule + `,"match":{"headers":[{"present":true}]}}`), `rules[0].match.headers[0].name: required`},
		{"header upper-case name", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"X-Env","present":true}]}}`), `rules[0].match.headers[0].name: ` + headerNameRule},
		{"header two conditions", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"x","exact":"a","prefix":"b"}]}}`), `rules[0].match.headers[0]: needs exactly one of exact, prefix, present: true, absent: true`},
		{"header no condition", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"x"}]}}`), `rules[0].match.headers[0]: needs exactly one of exact, prefix, present: true, absent: true`},
		{"header present false", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"x","present":false}]}}`), `rules[0].match.headers[0].present: must be true when given (use absent: true to match requests without the header); rules[0].match.headers[0]: needs exactly one of exact, prefix, present: true, absent: true`},
		{"header exact empty", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"x","exact":""}]}}`), `rules[0].match.headers[0].exact: must not be empty (use present: true); rules[0].match.headers[0]: needs exactly one of exact, prefix, present: true, absent: true`},
		{"header value newline", policyWith(`{` + okRule + `,"match":{"headers":[{"name":"x","exact":"a\nb"}]}}`), `rules[0].match.headers[0].exact: must not contain control characters (RFC 9110 §5.5)`},
		{"too many headers", policyWith(`{` + okRule + `,"match":{"headers":[` + strings.Repeat(`{"name":"x","present":true},`, MaxHeaderMatches) + `{"name":"x","present":true}]}}`), `rules[0].match.headers: at most 16 conditions, got 17`},
		// Key.
		{"unknown key part", policyWith(`{` + okRule + `,"key":["ip"]}`), `rules[0].key[0]: unknown key part "ip"; ` + keyPartRule},
		{"empty key part", policyWith(`{` + okRule + `,"key":[""]}`), `rules[0].key[0]: empty key part; ` + keyPartRule},
		{"empty alternative", policyWith(`{` + okRule + `,"key":["user|"]}`), `rules[0].key[0]: unknown key part ""; ` + keyPartRule},
		{"bad header part", policyWith(`{` + okRule + `,"key":["header:X-Key"]}`), `rules[0].key[0]: unknown key part "header:X-Key"; ` + keyPartRule},
		{"duplicate key part", policyWith(`{` + okRule + `,"key":["method","method"]}`), `rules[0].key[1]: duplicate key part "method"`},
		{"duplicate alternative", policyWith(`{` + okRule + `,"key":["user|user"]}`), `rules[0].key[0]: duplicate alternative "user"`},
		{"too many alternatives", policyWith(`{` + okRule + `,"key":["user|tenant|method|path|route"]}`), `rules[0].key[0]: at most 4 alternatives`},
		{"too many key parts", policyWith(`{` + okRule + `,"key":["client_ip","user","tenant","route","method","path","header:a","header:b","header:c"]}`), `rules[0].key: at most 8 parts, got 9`},
		{"user without identity", `{"policy":"p","rules":[{` + okRule + `,"key":["user"]}]}`, `rules[0].key[0]: "user" needs identity.user_header`},
		{"tenant without identity", `{"policy":"p","rules":[{` + okRule + `,"key":["client_ip|tenant"]}]}`, `rules[0].key[0]: "tenant" needs identity.tenant_header`},
		// Algorithm and parameters (bounds from package limit).
		{"no algorithm", policyWith(`{"id":"r","limit":1,"window":"1s"}`), `rules[0].algorithm: required`},
		{"unknown algorithm", policyWith(`{"id":"r","algorithm":"leaky","limit":1,"window":"1s"}`), `rules[0].algorithm: unknown algorithm "leaky"; want token_bucket, time_wheel, fixed_window, gcra, sliding_log or concurrency`},
		{"no limit", policyWith(`{"id":"r","algorithm":"gcra","window":"1s"}`), `rules[0].limit: must be > 0`},
		{"zero limit", policyWith(`{"id":"r","algorithm":"gcra","limit":0,"window":"1s"}`), `rules[0].limit: must be > 0`},
		{"absurd limit", policyWith(`{"id":"r","algorithm":"gcra","limit":18446744073709551615,"window":"1s"}`), `rules[0].limit: must be <= ` + strconv.FormatUint(limit.MaxLimit, 10) + ` for gcra, got 18446744073709551615`},
		{"sliding log limit", policyWith(`{"id":"r","algorithm":"sliding_log","limit":` + strconv.FormatUint(limit.MaxSlidingLogLimit+1, 10) + `,"window":"1s"}`), `rules[0].limit: must be <= ` + strconv.FormatUint(limit.MaxSlidingLogLimit, 10) + ` for sliding_log, got ` + strconv.FormatUint(limit.MaxSlidingLogLimit+1, 10)},
		{"no window", policyWith(`{"id":"r","algorithm":"gcra","limit":1}`), `rules[0].window: must be > 0`},
		{"negative window", policyWith(`{"id":"r","algorithm":"gcra","limit":1,"window":"-1s"}`), `rules[0].window: must be > 0`},
		{"tiny window", policyWith(`{"id":"r","algorithm":"gcra","limit":1,"window":"1us"}`), `rules[0].window: must be >= ` + limit.MinWindow.String() + `, got 1µs`},
		{"huge window", policyWith(`{"id":"r","algorithm":"fixed_window","limit":1,"window":"` + (limit.MaxWindow + time.Hour).String() + `"}`), `rules[0].window: must be <= ` + limit.MaxWindow.String() + `, got ` + (limit.MaxWindow + time.Hour).String()},
		{"window on concurrency", policyWith(`{"id":"r","algorithm":"concurrency","limit":1,"window":"1s"}`), `rules[0].window: not used by concurrency, must be omitted`},
		{"too many slots", policyWith(`{"id":"r","algorithm":"time_wheel","limit":10,"window":"1m","slots":` + strconv.FormatUint(uint64(limit.MaxSlots)+1, 10) + `}`), `rules[0].slots: must be <= ` + strconv.FormatUint(uint64(limit.MaxSlots), 10) + `, got ` + strconv.FormatUint(uint64(limit.MaxSlots)+1, 10)},
		{"slots on gcra", policyWith(`{"id":"r","algorithm":"gcra","limit":10,"window":"1m","slots":6}`), `rules[0].slots: not used by gcra, must be omitted`},
		{"burst on fixed window", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1m","burst":6}`), `rules[0].burst: not used by fixed_window, must be omitted`},
		{"bad align", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1m","align":"day"}`), `rules[0].align: must be "calendar_day"`},
		{"align on gcra", policyWith(`{"id":"r","algorithm":"gcra","limit":10,"window":"1m","align":"calendar_day"}`), `rules[0].align: only for fixed_window`},
		{"calendar day window", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1h","align":"calendar_day"}`), `rules[0].window: must be 24h or omitted with calendar_day, got 1h0m0s`},
		{"unknown timezone", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"align":"calendar_day","timezone":"Mars/Base"}`), `rules[0].timezone: unknown time zone "Mars/Base" (want an IANA name such as Europe/Berlin)`},
		{"local timezone", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"align":"calendar_day","timezone":"Local"}`), `rules[0].timezone: unknown time zone "Local" (want an IANA name such as Europe/Berlin)`},
		{"timezone without align", policyWith(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1m","timezone":"Europe/Berlin"}`), `rules[0].timezone: only with calendar_day`},
		{"lease too long", policyWith(`{"id":"r","algorithm":"concurrency","limit":10,"lease":"` + (limit.MaxLease + time.Hour).String() + `"}`), `rules[0].lease: must be <= ` + limit.MaxLease.String() + `, got ` + (limit.MaxLease + time.Hour).String()},
		{"lease on gcra", policyWith(`{"id":"r","algorithm":"gcra","limit":10,"window":"1s","lease":"1m"}`), `rules[0].lease: not used by gcra, must be omitted`},
		// Cost, status.
		{"zero cost", policyWith(`{` + okRule + `,"cost":0}`), `rules[0].cost: must be >= 1 (omit it for the default of 1)`},
		{"huge cost", policyWith(`{` + okRule + `,"cost":1099511627777}`), `rules[0].cost: must be <= ` + strconv.FormatUint(MaxCost, 10)},
		{"cost header without max", policyWith(`{` + okRule + `,"cost_header":"x-cost"}`), `rules[0].max_cost: required with cost_header`},
		{"max cost without header", policyWith(`{` + okRule + `,"max_cost":5}`), `rules[0].max_cost: only with cost_header`},
		{"bad cost header", policyWith(`{` + okRule + `,"cost_header":"x cost","max_cost":5}`), `rules[0].cost_header: ` + headerNameRule},
		{"huge max cost", policyWith(`{` + okRule + `,"cost_header":"x-cost","max_cost":1099511627777}`), `rules[0].max_cost: must be <= ` + strconv.FormatUint(MaxCost, 10)},
		{"response cost on concurrency", policyWith(`{"id":"r","algorithm":"concurrency","limit":1,"response_cost_header":"x-used"}`), `rules[0].response_cost_header: not supported by concurrency (its state cannot be corrected after the fact)`},
		{"response cost on sliding log", policyWith(`{"id":"r","algorithm":"sliding_log","limit":1,"window":"1s","response_cost_header":"x-used"}`), `rules[0].response_cost_header: not supported by sliding_log (its state cannot be corrected after the fact)`},
		{"bad response cost header", policyWith(`{` + okRule + `,"response_cost_header":"X-Used"}`), `rules[0].response_cost_header: ` + headerNameRule},
		{"status 200", policyWith(`{` + okRule + `,"status":200}`), `rules[0].status: must be between 400 and 599`},
		{"status 600", policyWith(`{` + okRule + `,"status":600}`), `rules[0].status: must be between 400 and 599`},
		{"status 0", policyWith(`{` + okRule + `,"status":0}`), `rules[0].status: must be between 400 and 599`},
		// Several problems at once, in document order then field order.
		{"many", `{"policy":"Bad","foo":1,"rules":[{"id":"a","algorithm":"gcra","limit":0,"window":"x"},{"id":"a","algorithm":"nope"}]}`,
			`foo: unknown field; rules[0].window: must be a duration string such as "5m" or "1.5s"; policy: ` + identRule +
				`; rules[0].limit: must be > 0; rules[1].algorithm: unknown algorithm "nope"; want token_bucket, time_wheel, fixed_window, gcra, sliding_log or concurrency; rules[1].id: duplicate rule id "a" (also rules[0])`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(tt.doc))
			if err == nil {
				t.Fatalf("ParsePolicy accepted it: %#v", p)
			}
			if p != nil {
				t.Errorf("ParsePolicy returned a policy with an error")
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error is %T, not Errors: %v", err, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false")
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\ngot  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestFieldError(t *testing.T) {
	e := FieldError{Field: "rules[2].window", Message: "must be > 0"}
	if got := e.Error(); got != "rules[2].window: must be > 0" {
		t.Errorf("Error() = %q", got)
	}
	if got := (FieldError{Message: "bad"}).Error(); got != "bad" {
		t.Errorf("Error() = %q", got)
	}
	errs := Errors{e, {Field: "policy", Message: "required"}}
	if got := errs.Error(); got != "rules[2].window: must be > 0; policy: required" {
		t.Errorf("Errors.Error() = %q", got)
	}
}

func TestParseRule(t *testing.T) {
	r, err := ParseRule([]byte(`{"id":"r","algorithm":"gcra","limit":5,"window":"1s","key":["user"]}`), "")
	if err != nil {
		t.Fatalf("ParseRule: %v", err) // "user" needs a policy's identity: not checked here
	}
	if r.ID != "r" || r.Limit != 5 || r.Window != time.Second {
		t.Errorf("got %#v", r)
	}
	tests := []struct {
		name, doc, field, want string
	}{
		{"no prefix", `{"id":"R","algorithm":"gcra","limit":0,"window":"1s","x":1}`, "", `x: unknown field; id: ` + identRule + `; limit: must be > 0`},
		{"prefix", `{"id":"R","algorithm":"gcra","limit":0,"window":"1s","x":1}`, "rules[3]", `rules[3].x: unknown field; rules[3].id: ` + identRule + `; rules[3].limit: must be > 0`},
		{"malformed", `{"id":`, "rule", `rule.id: unexpected end of input, expected a value`},
		{"not an object", `"x"`, "rule", `rule: must be an object`},
		{"too large", `{"description":"` + strings.Repeat("a", MaxRuleBytes) + `"}`, "", `document is 65554 bytes, more than the limit of 65536`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRule([]byte(tt.doc), tt.field)
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error is %T: %v", err, err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\ngot  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestTimezones(t *testing.T) {
	for _, tz := range []string{"Europe/Berlin", "America/New_York", "Asia/Kolkata", "UTC"} {
		doc := policyWith(`{"id":"d","algorithm":"fixed_window","limit":5,"align":"calendar_day","timezone":"` + tz + `"}`)
		if _, err := ParsePolicy([]byte(doc)); err != nil {
			t.Errorf("%s: %v", tz, err)
		}
	}
	for _, tz := range []string{"Mars/Base", "Local", "europe/berlin", "../../etc/passwd", "Europe/Berlin "} {
		doc := policyWith(`{"id":"d","algorithm":"fixed_window","limit":5,"align":"calendar_day","timezone":"` + tz + `"}`)
		if _, err := ParsePolicy([]byte(doc)); err == nil {
			t.Errorf("%q accepted", tz)
		}
	}
}

func TestValidateBuiltPolicy(t *testing.T) {
	p := &Policy{Name: "p", Rules: []Rule{{ID: "r", Algorithm: "gcra", Limit: 1, Window: time.Second}}}
	if err := p.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	p.Rules = append(p.Rules, Rule{ID: "r", Algorithm: "gcra", Limit: 1, Window: time.Second, Description: "\xff"})
	err := p.Validate()
	want := `rules[1].description: must be at most 1024 bytes of UTF-8; rules[1].id: duplicate rule id "r" (also rules[0])`
	if err == nil || err.Error() != want {
		t.Fatalf("Validate = %v, want %s", err, want)
	}
	if !ValidName("default") || ValidName("") || ValidName("a b") || ValidName("_a") {
		t.Error("ValidName")
	}
}

func TestTooManyErrors(t *testing.T) {
	bad := `{"id":"X","algorithm":"x","limit":0,"status":1,"exempt":{"users":["","",""]}}`
	var rs []string
	for i := 0; i < 60; i++ {
		rs = append(rs, bad)
	}
	_, err := ParsePolicy([]byte(policyWith(rs...)))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %T", err)
	}
	if len(errs) != MaxErrors+1 || errs[MaxErrors] != (FieldError{Message: "too many errors; only the first 100 are listed"}) {
		t.Errorf("%d errors, last %v", len(errs), errs[len(errs)-1])
	}
}
