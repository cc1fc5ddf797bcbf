package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

func mustCompile(t testing.TB, doc string, env string) *Compiled {
	t.Helper()
	c, err := Compile(mustParse(t, doc), CompileOptions{Env: env})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func hdrs(kv ...string) []Header {
	var h []Header
	for i := 0; i+1 < len(kv); i += 2 {
		h = append(h, Header{Name: kv[i], Value: kv[i+1]})
	}
	return h
}

func TestMatch(t *testing.T) {
	c := mustCompile(t, `{"policy":"p","rules":[
		{"id":"all","algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"prefix","match":{"path_prefix":"/v1/auth"},"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"exact","match":{"path":"/v1/auth/login","methods":["POST","PUT"]},"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"hexact","match":{"headers":[{"name":"x-env","exact":"prod"}]},"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"hprefix","match":{"headers":[{"name":":authority","prefix":"api."}]},"algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"hpresent","match":{"headers":[{"name":"x-key","present":true},{"name":"x-debug","absent":true}]},"algorithm":"gcra","limit":1,"window":"1s"}
	]}`, "")
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{"root GET", Request{Method: "GET", Path: "/"}, []string{"all"}},
		{"prefix", Request{Method: "GET", Path: "/v1/auth/x"}, []string{"all", "prefix"}},
		{"prefix is bytewise", Request{Method: "GET", Path: "/v1/authors"}, []string{"all", "prefix"}},
		{"prefix itself", Request{Method: "GET", Path: "/v1/auth"}, []string{"all", "prefix"}},
		{"not prefix", Request{Method: "GET", Path: "/v1/aut"}, []string{"all"}},
		{"exact POST", Request{Method: "POST", Path: "/v1/auth/login"}, []string{"all", "prefix", "exact"}},
		{"exact PUT", Request{Method: "PUT", Path: "/v1/auth/login"}, []string{"all", "prefix", "exact"}},
		{"exact wrong method", Request{Method: "GET", Path: "/v1/auth/login"}, []string{"all", "prefix"}},
		{"method case-sensitive", Request{Method: "post", Path: "/v1/auth/login"}, []string{"all", "prefix"}},
		{"exact longer path", Request{Method: "POST", Path: "/v1/auth/login/"}, []string{"all", "prefix"}},
		{"header exact", Request{Path: "/", Headers: hdrs("x-env", "prod")}, []string{"all", "hexact"}},
		{"header exact differs", Request{Path: "/", Headers: hdrs("x-env", "production")}, []string{"all"}},
		{"header first occurrence", Request{Path: "/", Headers: hdrs("x-env", "dev", "x-env", "prod")}, []string{"all"}},
		{"header prefix", Request{Path: "/", Headers: hdrs(":authority", "api.example.com")}, []string{"all", "hprefix"}},
		{"header present and absent", Request{Path: "/", Headers: hdrs("x-key", "")}, []string{"all", "hpresent"}},
		{"header absent violated", Request{Path: "/", Headers: hdrs("x-key", "k", "x-debug", "1")}, []string{"all"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, i := range c.Match(&tt.req, nil) {
				got = append(got, c.Rule(i).ID)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Match = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExempt(t *testing.T) {
	c := mustCompile(t, `{"policy":"p","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},
		"exempt":{"cidrs":["10.0.0.0/8","2001:db8::/32"],"users":["ops-bot"],"tenants":["internal"]},
		"rules":[
		{"id":"a","algorithm":"gcra","limit":1,"window":"1s"},
		{"id":"b","algorithm":"gcra","limit":1,"window":"1s","exempt":{"cidrs":["192.0.2.7"],"users":["vip"]}}
	]}`, "")
	tests := []struct {
		name string
		req  Request
		want []int
	}{
		{"plain", Request{ClientIP: netip.MustParseAddr("192.0.2.1")}, []int{0, 1}},
		{"policy cidr", Request{ClientIP: netip.MustParseAddr("10.1.2.3")}, nil},
		{"policy cidr v4-mapped", Request{ClientIP: netip.MustParseAddr("::ffff:10.1.2.3")}, nil},
		{"policy cidr v6", Request{ClientIP: netip.MustParseAddr("2001:db8::1")}, nil},
		{"policy user header", Request{ClientIP: netip.MustParseAddr("192.0.2.1"), Headers: hdrs("x-user-id", "ops-bot")}, nil},
		{"policy user field", Request{User: "ops-bot"}, nil},
		{"policy tenant", Request{Headers: hdrs("x-tenant-id", "internal")}, nil},
		{"rule address", Request{ClientIP: netip.MustParseAddr("192.0.2.7")}, []int{0}},
		{"rule user", Request{Headers: hdrs("x-user-id", "vip")}, []int{0}},
		{"unknown ip", Request{}, []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.Match(&tt.req, nil)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Match = %v, want %v", got, tt.want)
			}
		})
	}
	if !c.Exempt(&Request{User: "ops-bot"}) || c.Exempt(&Request{User: "vip"}) {
		t.Error("Exempt")
	}
	if !c.RuleExempt(1, &Request{User: "vip"}) || c.RuleExempt(0, &Request{User: "vip"}) {
		t.Error("RuleExempt")
	}
}

const keyPolicy = `{"policy":"default","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"rules":[
	{"id":"login-per-ip","match":{"path_prefix":"/v1/auth/login"},"key":["client_ip"],"algorithm":"time_wheel","limit":10,"window":"5m","slots":30},
	{"id":"api","key":["user|client_ip","method"],"algorithm":"gcra","limit":10,"window":"1m"},
	{"id":"keys","key":["tenant","header:x-api-key"],"algorithm":"token_bucket","limit":10,"window":"1h"},
	{"id":"inflight","algorithm":"concurrency","limit":5},
	{"id":"route","match":{"path":"/a:b"},"key":["route","path"],"algorithm":"sliding_log","limit":5,"window":"1500ms"},
	{"id":"daily","key":["user"],"algorithm":"fixed_window","limit":5,"align":"calendar_day","timezone":"Europe/Berlin"},
	{"id":"any-route","key":["route"],"algorithm":"gcra","limit":1,"window":"100ms"}
]}`

func TestAppendKey(t *testing.T) {
	c := mustCompile(t, keyPolicy, "prod")
	ip4 := netip.MustParseAddr("203.0.113.7")
	ip6 := netip.MustParseAddr("2001:db8::1")
	tests := []struct {
		name string
		rule string
		req  Request
		want string // "" means no key
	}{
		{"client ip", "login-per-ip", Request{ClientIP: ip4}, "rl:prod:default/login-per-ip:ip=203.0.113.7:300s"},
		{"v4-mapped ip", "login-per-ip", Request{ClientIP: netip.MustParseAddr("::ffff:203.0.113.7")}, "rl:prod:default/login-per-ip:ip=203.0.113.7:300s"},
		{"no client ip", "login-per-ip", Request{}, ""},
		{"user wins", "api", Request{ClientIP: ip6, Method: "GET", Headers: hdrs("x-user-id", "alice")}, "rl:prod:default/api:user=alice|method=GET:60s"},
		{"user field wins over header", "api", Request{User: "bob", Method: "GET", Headers: hdrs("x-user-id", "alice")}, "rl:prod:default/api:user=bob|method=GET:60s"},
		{"fallback to ip", "api", Request{ClientIP: ip6, Method: "GET"}, "rl:prod:default/api:ip=2001%3Adb8%3A%3A1|method=GET:60s"},
		{"empty user falls back", "api", Request{ClientIP: ip4, Method: "GET", Headers: hdrs("x-user-id", "")}, "rl:prod:default/api:ip=203.0.113.7|method=GET:60s"},
		{"neither", "api", Request{Method: "GET"}, ""},
		{"escaped values", "keys", Request{Headers: hdrs("x-tenant-id", "a|b", "x-api-key", "k:1=%")}, "rl:prod:default/keys:tenant=a%7Cb|h.x-api-key=k%3A1%3D%25:3600s"},
		{"non-ascii and space", "keys", Request{Headers: hdrs("x-tenant-id", "é x", "x-api-key", "k")}, "rl:prod:default/keys:tenant=%C3%A9%20x|h.x-api-key=k:3600s"},
		{"missing header", "keys", Request{Headers: hdrs("x-tenant-id", "t")}, ""},
		{"global concurrency", "inflight", Request{}, "rl:prod:default/inflight:*:0s"},
		{"route and path", "route", Request{Path: "/a:b"}, "rl:prod:default/route:route=/a%3Ab|path=/a%3Ab:2s"},
		{"calendar day", "daily", Request{User: "u"}, "rl:prod:default/daily:user=u:86400s"},
		{"route without match", "any-route", Request{}, "rl:prod:default/any-route:route=*:1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := ruleIndex(t, c, tt.rule)
			prefix := []byte("keep")
			got, ok := c.AppendKey(prefix, i, &tt.req)
			if !strings.HasPrefix(string(got), "keep") {
				t.Fatalf("dst prefix clobbered: %q", got)
			}
			if tt.want == "" {
				if ok || string(got) != "keep" {
					t.Fatalf("AppendKey = %q, %v; want no key", got, ok)
				}
				return
			}
			if !ok || string(got[4:]) != tt.want {
				t.Fatalf("AppendKey = %q, %v\nwant %q", got[4:], ok, tt.want)
			}
		})
	}
}

func ruleIndex(t testing.TB, c *Compiled, id string) int {
	t.Helper()
	for i := 0; i < c.Len(); i++ {
		if c.Rule(i).ID == id {
			return i
		}
	}
	t.Fatalf("no rule %q", id)
	return -1
}

// TestKeyCollisions checks that values built to imitate separators give distinct keys.
func TestKeyCollisions(t *testing.T) {
	c := mustCompile(t, `{"policy":"p","identity":{"user_header":"u","tenant_header":"t"},"rules":[
		{"id":"r","key":["user|client_ip","tenant|header:x"],"algorithm":"gcra","limit":1,"window":"1s"}]}`, "")
	reqs := []Request{
		{Headers: hdrs("u", "a", "t", "b")},
		{Headers: hdrs("u", "a|tenant=b", "t", "c")},
		{Headers: hdrs("u", "a|tenant=b", "x", "c")},
		{Headers: hdrs("u", "a", "t", "b|c")},
		{Headers: hdrs("u", "a|tenant", "t", "b")},
		{Headers: hdrs("u", "a", "x", "b")},       // header x instead of tenant
		{Headers: hdrs("u", "1.2.3.4", "t", "b")}, // user that looks like an IP
		{ClientIP: netip.MustParseAddr("1.2.3.4"), Headers: hdrs("t", "b")},
		{Headers: hdrs("u", "a:1s", "t", "b")},
		{Headers: hdrs("u", "a%7Cb", "t", "c")},
		{Headers: hdrs("u", "a|b", "t", "c")},
		{Headers: hdrs("u", "ip=1.2.3.4", "t", "b")},
		{Headers: hdrs("u", "a=b", "t", "c")},
		{Headers: hdrs("u", "a", "t", "=b")},
	}
	seen := map[string]int{}
	for i := range reqs {
		k, ok := c.AppendKey(nil, 0, &reqs[i])
		if !ok {
			t.Fatalf("request %d: no key", i)
		}
		if strings.Count(string(k), ":") != 4 {
			t.Errorf("request %d: key %q has a ':' inside a field", i, k)
		}
		if j, dup := seen[string(k)]; dup {
			t.Errorf("requests %d and %d share key %q", j, i, k)
		}
		seen[string(k)] = i
	}
	// Escaping is injective on all single bytes and pairs.
	esc := map[string]string{}
	for a := 0; a < 256; a++ {
		for b := -1; b < 256; b += 17 {
			s := string([]byte{byte(a)})
			if b >= 0 {
				s += string([]byte{byte(b)})
			}
			e := string(appendEscaped(nil, s))
			if strings.ContainsAny(e, ":|=") {
				t.Fatalf("escape(%q) = %q contains a separator", s, e)
			}
			if prev, dup := esc[e]; dup && prev != s {
				t.Fatalf("escape(%q) = escape(%q) = %q", s, prev, e)
			}
			esc[e] = s
		}
	}
}

func TestCost(t *testing.T) {
	c := mustCompile(t, `{"policy":"p","rules":[
		{"id":"const","algorithm":"gcra","limit":100,"window":"1s"},
		{"id":"three","algorithm":"gcra","limit":100,"window":"1s","cost":3},
		{"id":"hdr","algorithm":"gcra","limit":100,"window":"1s","cost":2,"cost_header":"x-cost","max_cost":50}]}`, "")
	tests := []struct {
		name    string
		rule    int
		headers []Header
		want    uint64
		wantOK  bool
	}{
		{"default 1", 0, nil, 1, true},
		{"constant", 1, hdrs("x-cost", "9"), 3, true},
		{"from header", 2, hdrs("x-cost", "7"), 7, true},
		{"zero from header costs the minimum", 2, hdrs("x-cost", "0"), 1, false},
		{"leading zeros", 2, hdrs("x-cost", "007"), 7, true},
		{"missing header", 2, nil, 2, false},
		{"malformed header", 2, hdrs("x-cost", "7 "), 2, false},
		{"negative header", 2, hdrs("x-cost", "-1"), 2, false},
		{"huge header", 2, hdrs("x-cost", "99999999999999999999999"), 2, false},
		{"clamped", 2, hdrs("x-cost", "51"), 50, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := c.Cost(tt.rule, &Request{Headers: tt.headers})
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Cost = %d, %v; want %d, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestCompiledRule(t *testing.T) {
	c := mustCompile(t, string(readFile(t, "testdata/full.json")), "")
	if c.Env() != "default" || c.Name != "full.policy-1" || c.Len() != 6 {
		t.Fatalf("Env %q Name %q Len %d", c.Env(), c.Name, c.Len())
	}
	wantStatus := map[string]int{"tb": 429, "tw": 429, "fw": 403, "gcra": 429, "log": 429, "inflight": 429}
	for i := 0; i < c.Len(); i++ {
		r := c.Rule(i)
		if r.Status != wantStatus[r.ID] {
			t.Errorf("%s: Status %d, want %d", r.ID, r.Status, wantStatus[r.ID])
		}
		if r.Limiter == nil {
			t.Errorf("%s: no limiter", r.ID)
		}
	}
	fw := c.Rule(ruleIndex(t, c, "fw")).Config
	if !fw.CalendarDay || fw.Location == nil || fw.Location.String() != "Europe/Berlin" || fw.Algorithm != limit.FixedWindow {
		t.Errorf("fw config %+v", fw)
	}
	c2 := mustCompile(t, `{"policy":"p","rules":[{"id":"c","algorithm":"concurrency","limit":2}]}`, "")
	if r := c2.Rule(0); r.Status != 503 || r.PeriodSeconds != 0 || r.Config.Lease != 0 {
		t.Errorf("concurrency: %+v", r)
	}
	if c2.Rule(0).Shadow || !c.Rule(ruleIndex(t, c, "tw")).Shadow {
		t.Error("shadow")
	}
}

func TestCompileErrors(t *testing.T) {
	p := &Policy{Name: "p", Rules: []Rule{{ID: "r", Algorithm: "gcra", Limit: 1, Window: time.Second}}}
	if _, err := Compile(p, CompileOptions{Env: "Prod"}); err == nil || err.Error() != `rules: invalid env "Prod": `+identRule {
		t.Errorf("bad env: %v", err)
	}
	p.Rules[0].Window = 0
	_, err := Compile(p, CompileOptions{})
	var errs Errors
	if !errors.As(err, &errs) || err.Error() != "rules[0].window: must be > 0" {
		t.Errorf("invalid policy: %v", err)
	}
}

func TestFingerprint(t *testing.T) {
	base := Rule{ID: "r", Algorithm: "gcra", Limit: 10, Window: time.Second, Key: []string{"client_ip"}}
	fp := Fingerprint(&base)
	same := base
	same.Description, same.Shadow, same.Status = "changed", true, 503
	same.Exempt = Exempt{Users: []string{"x"}}
	if Fingerprint(&same) != fp {
		t.Error("description/shadow/status/exempt changed the fingerprint")
	}
	for name, change := range map[string]func(*Rule){
		"limit":     func(r *Rule) { r.Limit = 11 },
		"window":    func(r *Rule) { r.Window = 2 * time.Second },
		"key":       func(r *Rule) { r.Key = []string{"user"} },
		"match":     func(r *Rule) { r.Match.Path = "/x" },
		"algorithm": func(r *Rule) { r.Algorithm = "token_bucket" },
		"id":        func(r *Rule) { r.ID = "s" },
		"cost":      func(r *Rule) { r.Cost = 2 },
	} {
		r := base
		change(&r)
		if Fingerprint(&r) == fp {
			t.Errorf("changing %s kept the fingerprint", name)
		}
	}
}

func TestPathOnly(t *testing.T) {
	for in, want := range map[string]string{"/a/b?x=1": "/a/b", "/a#f": "/a", "/": "/", "": "", "/a?b#c": "/a"} {
		if got := PathOnly(in); got != want {
			t.Errorf("PathOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseCost(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "1": 1, "1099511627776": 1 << 40} {
		if got, ok := ParseCost(in); !ok || got != want {
			t.Errorf("ParseCost(%q) = %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{"", "-1", "+1", " 1", "1.0", "0x10", "1099511627777", "99999999999999999999"} {
		if _, ok := ParseCost(in); ok {
			t.Errorf("ParseCost(%q) accepted", in)
		}
	}
}

func TestMatchAndKeyDoNotAllocate(t *testing.T) {
	c := mustCompile(t, keyPolicy, "prod")
	req := &Request{Method: "POST", Path: "/v1/auth/login", ClientIP: netip.MustParseAddr("2001:db8::1"),
		Headers: hdrs("x-user-id", "alice", "x-tenant-id", "t|1", "x-api-key", "k")}
	out := make([]int, 0, c.Len())
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() {
		out = c.Match(req, out[:0])
		for _, i := range out {
			buf, _ = c.AppendKey(buf[:0], i, req)
			c.Cost(i, req)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request", allocs)
	}
	if len(out) != c.Len()-1 {
		t.Errorf("matched %d of %d rules, want all but one", len(out), c.Len())
	}
}

// TestClientIPSourceAskedOnlyWhenNeeded: a request that leaves ClientIP
// unset and gives a ClientIPSource is asked for the address at most once,
// and only by a CIDR exemption or a client_ip key part that reaches it.
func TestClientIPSourceAskedOnlyWhenNeeded(t *testing.T) {
	c := mustCompile(t, keyPolicy, "prod")
	api := -1
	for i := range c.Len() {
		if c.Rule(i).ID == "api" {
			api = i
		}
	}
	ex := mustCompile(t, `{"policy":"p","identity":{"user_header":"x-user-id"},
		"exempt":{"cidrs":["10.0.0.0/8"],"users":["ops-bot"]},
		"rules":[{"id":"a","algorithm":"gcra","limit":1,"window":"1s"}]}`, "")
	for _, tc := range []struct {
		name  string
		run   func(*Request) bool
		req   Request
		calls int
		want  bool
	}{
		{"key part reached by a request without a user", func(r *Request) bool {
			key, ok := c.AppendKey(nil, api, r)
			return ok && strings.Contains(string(key), "ip=10.1.2.3")
		}, Request{Method: "GET"}, 1, true},
		{"key part skipped by a request with a user", func(r *Request) bool {
			_, ok := c.AppendKey(nil, api, r)
			return ok
		}, Request{Method: "GET", User: "alice"}, 0, true},
		{"exemption by CIDR", ex.Exempt, Request{}, 1, true},
		{"exemption by user first", ex.Exempt, Request{User: "ops-bot"}, 0, true},
		{"set address used as is", ex.Exempt, Request{ClientIP: netip.MustParseAddr("192.0.2.1")}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			req := tc.req
			req.ClientIPSource = func() netip.Addr {
				calls++
				return netip.MustParseAddr("10.1.2.3")
			}
			if got := tc.run(&req); got != tc.want {
				t.Errorf("result %v, want %v", got, tc.want)
			}
			tc.run(&req) // a second use asks no more
			if calls != tc.calls {
				t.Errorf("ClientIPSource called %d times, want %d", calls, tc.calls)
			}
		})
	}
	// A source that does not know the address is asked once, not per use.
	calls := 0
	req := Request{ClientIPSource: func() netip.Addr { calls++; return netip.Addr{} }}
	first := ex.Exempt(&req)
	second := ex.Exempt(&req)
	if first || second || calls != 1 {
		t.Errorf("unknown address: exempt %v then %v, asked %d times; want not exempt, asked once", first, second, calls)
	}
}

// Rules with equal match conditions are decided once per request; Match must
// still answer for each rule what its own conditions and exempt list say,
// past the 64 rules it remembers answers for too.
func TestRulesWithEqualConditionsMatchAsEachOnItsOwn(t *testing.T) {
	variants := []string{
		`"match":{"path_prefix":"/api/"}`,
		`"match":{"path":"/api/login","methods":["POST"]}`,
		`"match":{"path_prefix":"/api/","headers":[{"name":"x-env","exact":"prod"}]}`,
		`"match":{"path_prefix":"/api/","headers":[{"name":"x-env","prefix":"pro"}]}`,
		``,
	}
	var rs []string
	for i := 0; i < 80; i++ {
		m := variants[i%len(variants)]
		if i >= 66 && i%2 == 0 {
			m = `"match":{"methods":["DELETE"]}` // first at rule 66: past the remembered 64
		}
		ex := ""
		if i%7 == 3 {
			ex = `,"exempt":{"users":["vip"]}`
		}
		if m != "" {
			m += ","
		}
		rs = append(rs, fmt.Sprintf(`{"id":"r%d",%s"algorithm":"gcra","limit":1,"window":"1s"%s}`, i, m, ex))
	}
	c := mustCompile(t, `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[`+strings.Join(rs, ",")+`]}`, "")
	reqs := []Request{
		{Method: "GET", Path: "/"},
		{Method: "GET", Path: "/api/x"},
		{Method: "POST", Path: "/api/login"},
		{Method: "POST", Path: "/api/login", Headers: hdrs("x-env", "prod", "x-user-id", "vip")},
		{Method: "GET", Path: "/api/x", Headers: hdrs("x-env", "produce")},
		{Method: "DELETE", Path: "/api/x", Headers: hdrs("x-env", "prod")},
		{Method: "DELETE", Path: "/", Headers: hdrs("x-user-id", "vip")},
	}
	shared := 0
	for i := range c.rules {
		if c.rules[i].matchClass != i {
			shared++
		}
	}
	if shared < 70 {
		t.Fatalf("%d rules share an earlier rule's conditions, want at least 70", shared)
	}
	for n, req := range reqs {
		var want []int
		for i := 0; i < c.Len(); i++ {
			if c.Matches(i, &req) && !c.RuleExempt(i, &req) {
				want = append(want, i)
			}
		}
		if got := c.Match(&req, nil); !reflect.DeepEqual(got, want) {
			t.Errorf("request %d: Match = %v, want %v", n, got, want)
		}
	}
}
