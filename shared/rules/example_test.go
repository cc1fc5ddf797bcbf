package rules_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/sluice-proxy/sluice/shared/rules"
)

func ExampleParsePolicy() {
	_, err := rules.ParsePolicy([]byte(`{
		"policy": "default",
		"rules": [{"id": "login", "algorithm": "gcra", "limit": 0, "window": "5m", "colour": "red"}]
	}`))
	var errs rules.Errors
	if errors.As(err, &errs) {
		for _, e := range errs {
			fmt.Printf("%s: %s\n", e.Field, e.Message)
		}
	}
	// Output:
	// rules[0].colour: unknown field
	// rules[0].limit: must be > 0
}

func ExampleEncodePolicy() {
	p := &rules.Policy{Name: "default", Version: 3, Rules: []rules.Rule{{
		ID: "all", Algorithm: "token_bucket", Limit: 100, Window: 60e9, Burst: 200,
	}}}
	fmt.Println(string(rules.EncodePolicy(p)))
	// Output:
	// {"policy":"default","version":3,"rules":[{"id":"all","algorithm":"token_bucket","limit":100,"window":"1m","burst":200}]}
}

func ExampleCompiled_AppendKey() {
	p, err := rules.ParsePolicy([]byte(`{
		"policy": "default",
		"identity": {"user_header": "x-user-id"},
		"rules": [{"id": "api", "match": {"path_prefix": "/v1/"}, "key": ["user|client_ip", "method"],
		           "algorithm": "gcra", "limit": 10, "window": "1m"}]
	}`))
	if err != nil {
		panic(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{Env: "prod"})
	if err != nil {
		panic(err)
	}
	req := &rules.Request{
		Method:   "GET",
		Path:     rules.PathOnly("/v1/items?page=2"),
		ClientIP: netip.MustParseAddr("2001:db8::1"),
	}
	matched := make([]int, 0, c.Len())
	buf := make([]byte, 0, 128)
	for _, i := range c.Match(req, matched) {
		key, ok := c.AppendKey(buf[:0], i, req)
		fmt.Println(c.Rule(i).ID, string(key), ok)
	}
	req.Headers = []rules.Header{{Name: "x-user-id", Value: "alice"}}
	key, _ := c.AppendKey(buf[:0], 0, req)
	fmt.Println(string(key))
	// Output:
	// api rl:prod:default/api:ip=2001%3Adb8%3A%3A1|method=GET:60s true
	// rl:prod:default/api:user=alice|method=GET:60s
}
