package api_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// bigRule is a valid rule of about 60 KiB (under rules.MaxRuleBytes).
func bigRule(id string) []byte {
	users := make([]string, 0, 230)
	for i := 0; i < 230; i++ {
		users = append(users, fmt.Sprintf("%q", fmt.Sprintf("u%03d-", i)+strings.Repeat("x", 250)))
	}
	return []byte(fmt.Sprintf(`{"id":%q,"algorithm":"token_bucket","limit":1,"window":"1s","exempt":{"users":[%s]}}`, id, strings.Join(users, ",")))
}

// TestRuleWritesKeepPolicyWithinMaxPolicyBytes: adding rules one by one must
// not store a policy larger than rules.MaxPolicyBytes (which no reader, the
// filter included, would accept, and every later write would fail on with a
// 500); the write that would cross the bound is a 400.
func TestRuleWritesKeepPolicyWithinMaxPolicyBytes(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	var refused bool
	for i := 0; i < 25 && !refused; i++ {
		id := fmt.Sprint("b", i)
		resp := r.admin.Do("POST", "/v1/policies/p/rules", bigRule(id))
		switch resp.Status {
		case 201:
		case 400:
			expectCode(t, resp, 400, "invalid_document", "add past the bound")
			refused = true
			// The same rule through PUT of the rule is refused too.
			expectCode(t, r.admin.Do("PUT", "/v1/policies/p/rules/"+id, bigRule(id)), 400, "invalid_document", "put past the bound")
		default:
			t.Fatalf("add %s: %d %s", id, resp.Status, resp.Body)
		}
	}
	if !refused {
		t.Fatal("25 rules of 60 KiB were all accepted")
	}
	got := r.admin.Do("GET", "/v1/policies/p", nil)
	expect(t, got, 200, "GET")
	if _, err := rules.ParsePolicy(got.Body); err != nil {
		t.Fatalf("stored policy (%d bytes) does not parse: %v", len(got.Body), err)
	}
	// The policy stays writable and readable.
	expect(t, r.admin.Do("GET", "/v1/policies/p/rules/r1", nil), 200, "GET rule")
	expect(t, r.admin.Do("DELETE", "/v1/policies/p/rules/b0", nil), 200, "delete a rule")
}
