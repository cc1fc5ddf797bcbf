package api_test

import "testing"

// TestEntityTagsWithCommas: RFC 9110 §8.8.3 allows "," inside an opaque tag,
// so a list holding such a tag is valid and must be parsed as a list, not
// rejected.
func TestEntityTagsWithCommas(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	v1 := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
	expect(t, v1, 201, "create")
	expect(t, r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", `"a,b", `+v1.ETag()), 304, "If-None-Match list with a comma in a tag")
	expect(t, r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", `"x,v1"`), 200, "If-None-Match one tag with a comma")
	expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 2), "If-Match", `"a,b",W/"c", `+v1.ETag()), 200, "If-Match list with a comma in a tag")
	expectCode(t, r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", `"v2" "v3"`), 400, "invalid_header", "tags without a comma")
	expectCode(t, r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", `"v2`), 400, "invalid_header", "unterminated tag")
}
