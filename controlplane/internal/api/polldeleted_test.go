package api_test

import (
	"testing"
	"time"
)

// TestLongPollOnDeletedPolicy: a client whose If-None-Match names a version
// older than the deletion has something that differs from the current state
// (no policy), so the poll answers 404 at once rather than after the wait;
// a client naming the deletion's own version or none keeps waiting for the
// re-creation.
func TestLongPollOnDeletedPolicy(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := startReplica(t, b)
			v1 := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
			expect(t, v1, 201, "create")
			expect(t, r.admin.Do("DELETE", "/v1/policies/p", nil), 200, "delete")
			start := time.Now()
			expectCode(t, r.read.Do("GET", "/v1/policies/p?wait=10s", nil, "If-None-Match", v1.ETag()), 404, "not_found", "poll with the pre-deletion tag")
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("poll with the pre-deletion tag answered after %s, not at once", d)
			}
			// Without a tag it still waits for the re-creation.
			ch := poll(r.read, "/v1/policies/p?wait=10s")
			waitWatchers(t, r, 1)
			expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 2)), 201, "re-create")
			if p := decodePolicy(t, await(t, ch, "poll for re-creation")); p.Version != 3 {
				t.Fatalf("re-creation poll got version %d", p.Version)
			}
		})
	}
}
