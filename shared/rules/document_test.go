package rules

import (
	"errors"
	"testing"
)

func TestDocumentMissing(t *testing.T) {
	for _, tc := range []struct {
		doc            string
		policy, rules_ bool // Missing("policy"), Missing("rules")
	}{
		{`{}`, true, true},
		{`{"policy":"p","rules":[]}`, false, false},
		{`{"policy":null,"rules":null}`, true, true},
		{`{"policy":5,"rules":[]}`, false, false}, // present with a bad value: reported, not missing
		{`{"policy":"p","rules":[`, false, false}, // malformed: not known
		{`[]`, false, false},                      // not an object: a decoding problem
		{`{"rules":[{"id":"r"}]}`, true, false},
	} {
		d := DecodePolicy([]byte(tc.doc))
		if got := d.Missing("policy"); got != tc.policy {
			t.Errorf("%s: Missing(policy) = %v", tc.doc, got)
		}
		if got := d.Missing("rules"); got != tc.rules_ {
			t.Errorf("%s: Missing(rules) = %v", tc.doc, got)
		}
	}
}

// TestDocumentCompletedBeforeValidation: a name set after decoding is validated
// with the rest, in one list, as the control plane does with the path's name.
func TestDocumentCompletedBeforeValidation(t *testing.T) {
	d := DecodePolicy([]byte(`{"rules":[{"id":"r","algorithm":"gcra","limit":1,"window":"1s"}]}`))
	if _, err := d.Validate(); err == nil {
		t.Fatal("a policy without a name validated")
	}
	d.Policy.Name = "p"
	p, err := d.Validate()
	if err != nil || p.Name != "p" || len(p.Rules) != 1 {
		t.Fatalf("Validate() = %+v, %v", p, err)
	}

	d = DecodePolicy([]byte(`{"rules":[{"id":"r","algorithm":"nope","limit":"x","window":"1s"}]}`))
	d.Policy.Name = "p"
	_, err = d.Validate()
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 2 || errs[0].Field != "rules[0].limit" || errs[1].Field != "rules[0].algorithm" {
		t.Fatalf("Validate() = %v; want the decoding problem (limit) then the meaning problem (algorithm)", err)
	}
	if _, again := d.Validate(); again.Error() != err.Error() {
		t.Fatalf("a second Validate() = %v, first %v", again, err)
	}
}
