package rules

import (
	"errors"
	"strings"
	"testing"
)

func TestQuotaFailureParsesAndRoundTrips(t *testing.T) {
	cases := []struct {
		members   string
		mode      string
		permille  uint32
		encodedAs string
	}{
		{``, QuotaFailureLocal, 0, ``},
		{`,"on_quota_failure":"pass"`, QuotaFailurePass, 0, `"on_quota_failure":"pass"`},
		{`,"on_quota_failure":"deny"`, QuotaFailureDeny, 0, `"on_quota_failure":"deny"`},
		{`,"on_quota_failure":"local","local_share":0.5`, QuotaFailureLocal, 500, `"local_share":0.5`},
		{`,"local_share":0.125`, QuotaFailureLocal, 125, `"local_share":0.125`},
		{`,"local_share":1`, QuotaFailureLocal, 1000, `"local_share":1`},
		{`,"local_share":0.05`, QuotaFailureLocal, 50, `"local_share":0.05`},
	}
	for _, c := range cases {
		doc := scopePolicy(`{"id":"r","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"` + c.members + `}`)
		p := mustParse(t, doc)
		r := &p.Rules[0]
		if r.QuotaFailure() != c.mode || r.LocalSharePermille != c.permille {
			t.Fatalf("%s: mode %q share %d", c.members, r.QuotaFailure(), r.LocalSharePermille)
		}
		enc := string(EncodePolicy(p))
		if c.encodedAs != "" && !strings.Contains(enc, c.encodedAs) {
			t.Fatalf("%s: encoding %s", c.members, enc)
		}
		q := mustParse(t, enc)
		if q.Rules[0].OnQuotaFailure != r.OnQuotaFailure || q.Rules[0].LocalSharePermille != r.LocalSharePermille {
			t.Fatalf("%s: round trip %+v", c.members, q.Rules[0])
		}
	}
}

func TestQuotaFailureValidationNamesTheField(t *testing.T) {
	cases := []struct{ rule, field, want string }{
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","on_quota_failure":"open"}`, "rules[1].on_quota_failure", `must be "local", "pass" or "deny"`},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","on_quota_failure":"pass"}`, "rules[1].on_quota_failure", "only with"},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","local_share":0.5}`, "rules[1].local_share", "only with"},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","on_quota_failure":"deny","local_share":0.5}`, "rules[1].local_share", `"local"`},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","local_share":0}`, "rules[1].local_share", "greater than 0"},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","local_share":1.5}`, "rules[1].local_share", "greater than 0"},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","local_share":0.3333}`, "rules[1].local_share", "three decimals"},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","local_share":"0.5"}`, "rules[1].local_share", ""},
		{`{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet","response_cost_header":"x-cost"}`, "rules[1].response_cost_header", "fleet"},
	}
	for _, c := range cases {
		_, err := ParsePolicy([]byte(scopePolicy(`{"id":"ok","algorithm":"fixed_window","limit":1,"window":"1s"},` + c.rule)))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Fatalf("%s: err %v, want Errors", c.rule, err)
		}
		if len(errs) != 1 || errs[0].Field != c.field || !strings.Contains(errs[0].Message, c.want) {
			t.Fatalf("%s: got %v, want one error at %s containing %q", c.rule, errs, c.field, c.want)
		}
	}
}

func TestQuotaFailureLeavesTheFingerprint(t *testing.T) {
	a := Rule{ID: "a", Algorithm: "fixed_window", Limit: 10, Scope: ScopeFleet}
	b := a
	b.OnQuotaFailure, b.LocalSharePermille = QuotaFailureLocal, 500
	if Fingerprint(&a) != Fingerprint(&b) {
		t.Fatal("on_quota_failure and local_share changed the fingerprint")
	}
}
