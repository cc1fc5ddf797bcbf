package api_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// limitOf returns the limit of rule r1 of a policy response.
func limitOf(t *testing.T, r *apitest.Response) int {
	t.Helper()
	p := decodePolicy(t, r)
	if len(p.Rules) == 0 {
		t.Fatalf("policy without rules: %s", r.Body)
	}
	return p.Rules[0].Limit
}

// awaitLimit waits until GET /v1/policies/p on c serves rule r1 with limit
// (the document of the last acknowledged write), and returns that response.
func awaitLimit(t *testing.T, c *apitest.Client, limit int, what string) *apitest.Response {
	t.Helper()
	deadline := time.Now().Add(guard)
	var last *apitest.Response
	for time.Now().Before(deadline) {
		last = c.Do("GET", "/v1/policies/p", nil)
		if last.Status == 200 && limitOf(t, last) == limit {
			return last
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: GET serves %d %s (ETag %s), want the acknowledged limit %d", what, last.Status, last.Body, last.ETag(), limit)
	return nil
}

// TestWritesAfterRedisLostDataAreServed: Redis without persistence
// acknowledges v1..v3 and then loses them (a restart, or FLUSHALL). Both
// replicas notice: the lost policy is no longer served, the writes made
// afterwards (which get versions 1, 2, 3 again) are served by both, each
// with an ETag that differs from the lost document's, and a client holding
// the lost v3's ETag gets the new document, not a 304.
func TestWritesAfterRedisLostDataAreServed(t *testing.T) {
	for _, loss := range []string{"restart", "flushall"} {
		t.Run(loss, func(t *testing.T) {
			b := redisBackend(t, redisproc.Options{})
			a, other := startReplica(t, b), startReplica(t, b)

			var lost []string // ETags of v1..v3 before the loss
			for i, limit := range []int{10, 20, 30} {
				resp := a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", limit))
				expect(t, resp, []int{201, 200, 200}[i], "write before the loss")
				lost = append(lost, resp.ETag())
			}
			awaitLimit(t, other.read, 30, "other replica before the loss")

			switch loss {
			case "restart":
				b.redis.Restart() // no persistence: it comes back empty
			case "flushall":
				c := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
				if err := c.FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			// The store no longer has the policy: neither replica serves
			// the lost document.
			for _, r := range []*replica{a, other} {
				deadline := time.Now().Add(guard)
				for r.admin.Do("GET", "/v1/policies/p", nil).Status != 404 {
					if time.Now().After(deadline) {
						t.Errorf("a replica still serves the lost policy %s after the store lost it", r.admin.Do("GET", "/v1/policies/p", nil).Body)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			// New writes get versions 1..3 again, with other documents.
			for i, limit := range []int{40, 50, 60} {
				resp := a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", limit))
				expect(t, resp, []int{201, 200, 200}[i], "write after the loss")
				if p := decodePolicy(t, resp); p.Version != uint64(i+1) {
					t.Fatalf("write %d after the loss got version %d", i, p.Version)
				}
				if resp.ETag() == lost[i] {
					t.Errorf("version %d after the loss has the lost document's ETag %s", i+1, resp.ETag())
				}
				for _, r := range []*replica{a, other} {
					awaitLimit(t, r.read, limit, "after the loss")
				}
			}
			for _, r := range []*replica{a, other} {
				got := r.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", lost[2])
				expect(t, got, 200, "conditional GET with the lost v3's ETag")
				if limitOf(t, got) != 60 {
					t.Fatalf("conditional GET with the lost ETag served %s", got.Body)
				}
				// A long poll from a client holding the lost document answers at once.
				expect(t, r.read.Do("GET", "/v1/policies/p?wait=10s", nil, "If-None-Match", lost[2]), 200, "long poll with the lost ETag")
			}
		})
	}
}

// TestLostPolicyIsRestoredAsANewVersion: Redis without persistence restarts
// empty under two replicas that serve v3 of a policy. Without anyone
// re-applying it, the policy is served again within the guard time: its
// last acknowledged document (limit 30), written back once (one replica
// wins, the other adopts it) as version 1 of a new epoch, with a history
// entry saying it was restored, counted in Restores. A write made after
// that continues from it.
func TestLostPolicyIsRestoredAsANewVersion(t *testing.T) {
	b := redisBackend(t, redisproc.Options{})
	a, other := startRestoringReplica(t, b), startRestoringReplica(t, b)
	var lost string
	for i, limit := range []int{10, 20, 30} {
		resp := a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", limit))
		expect(t, resp, []int{201, 200, 200}[i], "write before the loss")
		lost = resp.ETag()
	}
	awaitLimit(t, other.read, 30, "other replica before the loss")

	b.redis.Restart() // no persistence: it comes back empty

	// Wait until the store itself has the policy again.
	deadline := time.Now().Add(guard)
	var hist *apitest.Response
	for {
		hist = a.admin.Do("GET", "/v1/policies/p/versions", nil)
		if hist.Status == 200 && strings.Contains(string(hist.Body), `"restore"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store never got the lost policy back: %d %s", hist.Status, hist.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range []*replica{a, other} {
		// Until its snapshot reloads, a replica may still serve the document it held.
		got := awaitLimit(t, r.read, 30, "after the loss")
		for deadline := time.Now().Add(guard); got.ETag() == lost && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			got = awaitLimit(t, r.read, 30, "after the loss")
		}
		if p := decodePolicy(t, got); p.Version != 1 {
			t.Errorf("restored policy has version %d, want 1 (the store counts again)", p.Version)
		}
		if got.ETag() == lost {
			t.Errorf("the restored document has the lost v3's ETag %s", lost)
		}
	}
	var vs struct {
		Current  uint64
		Versions []struct {
			Version uint64
			Op      string
			Actor   string
			Detail  string
		}
	}
	if err := json.Unmarshal(hist.Body, &vs); err != nil {
		t.Fatal(err)
	}
	if vs.Current != 1 || len(vs.Versions) != 1 || vs.Versions[0].Op != "restore" ||
		!strings.Contains(vs.Versions[0].Detail, "version 3") {
		t.Fatalf("history after the restore: %s", hist.Body)
	}
	if n := a.snap.Restores() + other.snap.Restores(); n != 1 {
		t.Errorf("restores counted %d, want 1 (one replica writes, the other adopts)", n)
	}
	resp := other.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 40))
	expect(t, resp, 200, "write after the restore")
	if p := decodePolicy(t, resp); p.Version != 2 {
		t.Fatalf("write after the restore got version %d, want 2", p.Version)
	}
	awaitLimit(t, a.read, 40, "after a write that follows the restore")
}
