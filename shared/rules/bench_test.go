package rules

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// policy50 is a 50-rule policy using every feature, about 15 KB.
func policy50() []byte {
	var rs []string
	algs := []string{
		`"algorithm":"time_wheel","limit":100,"window":"5m","slots":30`,
		`"algorithm":"token_bucket","limit":100,"window":"1s","burst":200`,
		`"algorithm":"gcra","limit":10,"window":"1s","burst":5`,
		`"algorithm":"fixed_window","limit":5000,"align":"calendar_day","timezone":"Europe/Berlin"`,
		`"algorithm":"sliding_log","limit":20,"window":"1m"`,
		`"algorithm":"concurrency","limit":50,"lease":"30s"`,
	}
	for i := 0; i < 50; i++ {
		n := strconv.Itoa(i)
		rs = append(rs, `{"id":"rule-`+n+`","description":"rule number `+n+`",`+
			`"match":{"path_prefix":"/v1/svc`+n+`/","methods":["GET","POST"],"headers":[{"name":"x-env","exact":"prod"}]},`+
			`"key":["user|client_ip","header:x-api-key"],`+algs[i%len(algs)]+`,"exempt":{"cidrs":["10.`+n+`.0.0/16"]}}`)
	}
	return []byte(`{"policy":"bench","version":42,"identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},` +
		`"exempt":{"cidrs":["127.0.0.0/8","::1"],"users":["ops-bot"]},"rules":[` + strings.Join(rs, ",") + `]}`)
}

func BenchmarkParsePolicy50(b *testing.B) {
	doc := policy50()
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParsePolicy(doc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodePolicy50(b *testing.B) {
	p, err := ParsePolicy(policy50())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		EncodePolicy(p)
	}
}

// benchRequest is a typical API request: a handful of headers, an IPv4 client.
func benchRequest() *Request {
	return &Request{
		Method:   "POST",
		Path:     "/v1/auth/login",
		ClientIP: netip.MustParseAddr("203.0.113.7"),
		Headers: []Header{
			{":authority", "api.example.com"}, {":method", "POST"}, {":path", "/v1/auth/login"},
			{"user-agent", "bench/1.0"}, {"content-type", "application/json"}, {"x-env", "prod"},
			{"x-user-id", "alice"}, {"x-tenant-id", "acme"}, {"x-api-key", "k-123:456"},
		},
	}
}

// benchMatchKey measures what the filter pays per request: match every rule, then
// build the key and cost of each matching one.
func benchMatchKey(b *testing.B, rules int) {
	rule := func(i int) string {
		n := strconv.Itoa(i)
		return `{"id":"r` + n + `","match":{"path_prefix":"/v1/","methods":["POST"],"headers":[{"name":"x-env","exact":"prod"}]},` +
			`"key":["user|client_ip","header:x-api-key"],"algorithm":"gcra","limit":10,"window":"1m"}`
	}
	var rs []string
	for i := 0; i < rules; i++ {
		rs = append(rs, rule(i))
	}
	c := mustCompile(b, `{"policy":"bench","identity":{"user_header":"x-user-id"},"exempt":{"cidrs":["10.0.0.0/8"],"users":["ops-bot"]},"rules":[`+strings.Join(rs, ",")+`]}`, "prod")
	req := benchRequest()
	out := make([]int, 0, c.Len())
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		out = c.Match(req, out[:0])
		for _, i := range out {
			var ok bool
			if buf, ok = c.AppendKey(buf[:0], i, req); !ok {
				b.Fatal("no key")
			}
			c.Cost(i, req)
		}
	}
	if len(out) != rules {
		b.Fatalf("matched %d rules, want %d", len(out), rules)
	}
}

func BenchmarkMatchKey1(b *testing.B) { benchMatchKey(b, 1) }
func BenchmarkMatchKey5(b *testing.B) { benchMatchKey(b, 5) }

func BenchmarkCompile50(b *testing.B) {
	p, err := ParsePolicy(policy50())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(p, CompileOptions{Env: "prod"}); err != nil {
			b.Fatal(err)
		}
	}
}
