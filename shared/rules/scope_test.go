package rules

import (
	"errors"
	"strings"
	"testing"
)

func scopePolicy(rule string) string {
	return `{"policy":"p","rules":[` + rule + `]}`
}

func TestScopeParsesAndRoundTrips(t *testing.T) {
	for _, sc := range []string{"", ScopeEnvoy, ScopeFleet} {
		member := ""
		if sc != "" {
			member = `,"scope":"` + sc + `"`
		}
		doc := scopePolicy(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1m"` + member + `}`)
		p := mustParse(t, doc)
		if p.Rules[0].Scope != sc {
			t.Fatalf("scope %q: parsed %q", sc, p.Rules[0].Scope)
		}
		if got := p.Rules[0].IsFleet(); got != (sc == ScopeFleet) {
			t.Fatalf("scope %q: IsFleet %v", sc, got)
		}
		enc := string(EncodePolicy(p))
		if (sc != "") != strings.Contains(enc, `"scope":"`+sc+`"`) {
			t.Fatalf("scope %q: encoding %s", sc, enc)
		}
		if q := mustParse(t, enc); q.Rules[0].Scope != sc {
			t.Fatalf("scope %q: round trip %q", sc, q.Rules[0].Scope)
		}
	}
}

func TestScopeValidationNamesTheField(t *testing.T) {
	cases := []struct {
		rule, want string
	}{
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"global"}`, `must be "envoy" or "fleet"`},
		{`{"id":"a","algorithm":"sliding_log","limit":10,"window":"1m","scope":"fleet"}`, "sliding_log"},
		{`{"id":"a","algorithm":"concurrency","limit":10,"scope":"fleet"}`, "concurrency"},
		{`{"id":"a","algorithm":"gcra","limit":10,"window":"1m","scope":"fleet"}`, "burst of at least 1"},
		{`{"id":"a","algorithm":"token_bucket","limit":10,"burst":1,"window":"1m","scope":"fleet"}`, "capacity"},
		{`{"id":"a","algorithm":"token_bucket","limit":1,"window":"1m","scope":"fleet"}`, "capacity"},
	}
	for _, c := range cases {
		_, err := ParsePolicy([]byte(scopePolicy(`{"id":"ok","algorithm":"fixed_window","limit":1,"window":"1s"},` + c.rule)))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Fatalf("%s: err %v, want Errors", c.rule, err)
		}
		if len(errs) != 1 || errs[0].Field != "rules[1].scope" || !strings.Contains(errs[0].Message, c.want) {
			t.Fatalf("%s: got %v, want one error at rules[1].scope containing %q", c.rule, errs, c.want)
		}
	}
	for _, rule := range []string{
		`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"}`,
		`{"id":"a","algorithm":"time_wheel","limit":10,"window":"1m","scope":"fleet"}`,
		`{"id":"a","algorithm":"token_bucket","limit":10,"window":"1m","scope":"fleet"}`,
		`{"id":"a","algorithm":"gcra","limit":10,"burst":1,"window":"1m","scope":"fleet"}`,
		`{"id":"a","algorithm":"concurrency","limit":10,"scope":"envoy"}`,
		`{"id":"a","algorithm":"fixed_window","limit":10,"align":"calendar_day","scope":"fleet"}`,
	} {
		if _, err := ParsePolicy([]byte(scopePolicy(rule))); err != nil {
			t.Fatalf("%s: %v", rule, err)
		}
	}
}

// The fingerprint ignores scope: the filter counts the same way under either, so a
// scope change must not reset its counters.
func TestScopeDoesNotChangeFingerprint(t *testing.T) {
	r := Rule{ID: "a", Algorithm: "fixed_window", Limit: 10, Window: 60e9}
	f := r
	f.Scope = ScopeFleet
	if Fingerprint(&r) != Fingerprint(&f) {
		t.Fatal("fingerprint changed with scope")
	}
}

func TestOwnsKey(t *testing.T) {
	p := mustParse(t, `{"policy":"p","rules":[
		{"id":"g","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
		{"id":"u","key":["client_ip"],"algorithm":"fixed_window","limit":10,"window":"1500ms"}]}`)
	c, err := Compile(p, CompileOptions{Env: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	g, u := c.Rule(0), c.Rule(1)
	if !g.Fleet() || u.Fleet() {
		t.Fatal("Fleet()")
	}
	for _, k := range []struct {
		r    *CompiledRule
		key  string
		want bool
	}{
		{g, "rl:prod:p/g:*:60s", true},
		{g, "rl:prod:p/g:ip=1.2.3.4:60s", false},
		{g, "rl:staging:p/g:*:60s", false},
		{g, "rl:prod:p/g:*:61s", false},
		{u, "rl:prod:p/u:ip=1.2.3.4:2s", true},
		{u, "rl:prod:p/u:*:2s", false},
		{u, "rl:prod:p/u::2s", false},
		{u, "rl:prod:p/u:a:b:2s", false},
		{u, "rl:prod:p/g:ip=1.2.3.4:2s", false},
	} {
		if got := k.r.OwnsKey(k.key); got != k.want {
			t.Errorf("%s OwnsKey(%q) = %v, want %v", k.r.ID, k.key, got, k.want)
		}
	}
}
