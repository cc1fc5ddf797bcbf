package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// TestDeletedPolicyStopsBeingEnforced: after DELETE of the policy, every worker
// of the proxy stops enforcing it as fast as it picks up a PUT (access log:
// reason no_policy, and the user over the limit passes); a PUT afterwards is
// enforced again.
func TestDeletedPolicyStopsBeingEnforced(t *testing.T) {
	s := startStack(t, false)
	v := s.applyDemo()
	putTook := s.awaitVersion(v)
	user := fmt.Sprint("del-", time.Now().UnixNano())
	for i := 0; i < 6; i++ {
		s.get("GET", "/api/x", "X-User-Id", user)
	}
	if st := s.get("GET", "/api/x", "X-User-Id", user).status; st != 429 {
		t.Fatalf("the demo's api-per-user did not trip: %d", st)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+s.cpAddr+"/v1/policies/default", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("DELETE → %d", resp.StatusCode)
	}
	start := time.Now()
	n, run := 0, 0
	if !proctest.WaitFor(30*time.Second, func() bool {
		for {
			n++
			id := fmt.Sprintf("after-delete-%d", n)
			r := s.get("GET", "/api/x", "X-User-Id", user, "X-Request-Id", id)
			if r.status != 200 || rateLimit(s.logOf(id))["reason"] != "no_policy" {
				run = 0
				return false
			}
			if run++; run >= 2*workers {
				return true
			}
		}
	}) {
		t.Fatalf("the proxy still enforced the deleted policy 30s after DELETE\n%s", s.dp.Output())
	}
	t.Logf("deleted policy dropped by every worker in %s (the PUT took %s)", time.Since(start), putTook)
	v2 := s.applyDemo()
	if v2 <= v {
		t.Fatalf("re-created at version %d, not after %d", v2, v)
	}
	s.awaitVersion(v2)
}
