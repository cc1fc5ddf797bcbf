package rules

import (
	"net/netip"
	"reflect"
	"testing"
)

// FuzzParsePolicy checks that ParsePolicy never panics, that every error it returns
// is Errors, and that every accepted policy re-encodes and re-parses to the same
// policy, compiles, and can match and build keys. Seeds: testdata/fuzz/FuzzParsePolicy
// and the documents under testdata.
func FuzzParsePolicy(f *testing.F) {
	f.Add(readFile(f, "testdata/example.json"))
	f.Add(readFile(f, "testdata/full.json"))
	f.Add([]byte(keyPolicy))
	req := &Request{Method: "POST", Path: "/v1/auth/login", ClientIP: netip.MustParseAddr("192.0.2.1"),
		Headers: []Header{{"x-user-id", "alice"}, {"x-tenant-id", "t"}, {"x-env", "prod"}, {"x-cost", "3"}}}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := ParsePolicy(doc)
		if err != nil {
			if _, ok := err.(Errors); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			if p != nil {
				t.Fatal("policy returned with an error")
			}
			return
		}
		enc := EncodePolicy(p)
		q, err := ParsePolicy(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed the policy:\n%#v\n%#v", p, q)
		}
		c, err := Compile(p, CompileOptions{Env: "fuzz"})
		if err != nil {
			t.Fatalf("valid policy does not compile: %v\n%s", err, enc)
		}
		var buf []byte
		for _, i := range c.Match(req, nil) {
			buf, _ = c.AppendKey(buf[:0], i, req)
			c.Cost(i, req)
		}
	})
}
