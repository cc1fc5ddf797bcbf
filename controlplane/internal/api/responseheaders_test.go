package api_test

import (
	"testing"
)

// TestPolicyResponseHeadersKeptAndChecked: a policy's response_headers is
// stored and served as written, survives a rule write, and a bad set is a
// 400 naming the field.
func TestPolicyResponseHeadersKeptAndChecked(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := startReplica(t, b)
			c := r.admin
			doc := []byte(`{"policy":"p","response_headers":{"set":"ratelimit","on_allow":true},` +
				`"rules":[{"id":"r1","algorithm":"fixed_window","limit":10,"window":"1m"}]}`)
			expect(t, c.Do("PUT", "/v1/policies/p", doc), 201, "PUT with response_headers")
			expect(t, c.Do("POST", "/v1/policies/p/rules", ruleDoc("r2", 5)), 201, "POST rule")
			var got struct {
				ResponseHeaders *struct {
					Set     string `json:"set"`
					OnAllow bool   `json:"on_allow"`
				} `json:"response_headers"`
			}
			c.Do("GET", "/v1/policies/p", nil).JSON(t, &got)
			if rh := got.ResponseHeaders; rh == nil || rh.Set != "ratelimit" || !rh.OnAllow {
				t.Fatalf("response_headers after a rule write = %+v, want ratelimit on_allow", rh)
			}

			bad := c.Do("PUT", "/v1/policies/p", []byte(`{"policy":"p","response_headers":{"set":"X-RateLimit"},"rules":[]}`))
			expectCode(t, bad, 400, "invalid_document", "PUT bad set")
			if got := errorFields(t, bad); len(got) != 1 || got[0] != "response_headers.set" {
				t.Fatalf("detail fields = %q, want one on response_headers.set", got)
			}
			expectCode(t, c.Do("PUT", "/v1/policies/p", []byte(`{"policy":"p","response_headers":{"on_allow":true},"rules":[]}`)),
				400, "invalid_document", "PUT response_headers without set")
		})
	}
}
