package api_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

func waitStatus(t *testing.T, c *apitest.Client, path string, status int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for time.Now().Before(deadline) {
		if c.Do("GET", path, nil).Status == status {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("GET %s never answered %d", path, status)
}

// TestRedisOutage: with Redis killed, reads and long polls are served from
// memory, writes answer 503 and readiness turns false; once Redis is back
// everything recovers by itself and no acknowledged write is lost (Redis
// runs with appendonly + appendfsync always, so a restart keeps its data).
func TestRedisOutage(t *testing.T) {
	b := redisBackend(t, redisproc.Options{AppendOnly: true})
	short := func(o *api.Options) { o.StoreTimeout = time.Second }
	a, other := startReplica(t, b, short), startReplica(t, b, short)

	expect(t, a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	expect(t, other.read.Do("GET", "/v1/policies/p", nil), 200, "other learns p")

	// Writers add rules w0, w1, ... one after another, through both replicas,
	// across the outage; every acknowledged id must survive.
	var (
		mu    sync.Mutex
		acked []string
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := []*apitest.Client{a.admin, other.admin}[i%2]
			id := fmt.Sprint("w", i)
			resp := c.Do("POST", "/v1/policies/p/rules", ruleDoc(id, 1))
			switch resp.Status {
			case 201:
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
			case 503:
				if resp.ErrorCode() != "store_unavailable" {
					t.Errorf("503 with code %q", resp.ErrorCode())
				}
			default:
				t.Errorf("write %s: %d %s", id, resp.Status, resp.Body)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	for ackedCount() < 5 {
		time.Sleep(5 * time.Millisecond)
	}

	// A long poll on the other replica, opened before the outage.
	cur := other.read.Do("GET", "/v1/policies/p", nil)
	expect(t, cur, 200, "current on other")
	polled := poll(other.read, "/v1/policies/p?wait=20s", "If-None-Match", `"v999"`) // stale tag: answers at once
	expect(t, await(t, polled, "stale poll"), 200, "stale poll")

	b.redis.Kill()
	waitStatus(t, a.anon, "/readyz", 503)
	expectCode(t, a.anon.Do("GET", "/readyz", nil), 503, "store_unavailable", "readyz during outage")
	expectCode(t, a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 2)), 503, "store_unavailable", "write during outage")
	expectCode(t, a.admin.Do("PUT", "/v1/policies/newone", policyDoc("newone", 2)), 503, "store_unavailable", "create during outage")
	expectCode(t, a.admin.Do("GET", "/v1/policies/p/versions", nil), 503, "store_unavailable", "history during outage")

	// Reads are served from the snapshot.
	got := a.read.Do("GET", "/v1/policies/p", nil)
	expect(t, got, 200, "read during outage")
	expect(t, a.read.Do("GET", "/v1/policies/p", nil, "If-None-Match", got.ETag()), 304, "conditional read during outage")
	expect(t, a.read.Do("GET", "/v1/policies/p/rules/w0", nil), 200, "rule read during outage")
	expect(t, a.read.Do("GET", "/v1/policies", nil), 200, "list during outage")
	expectCode(t, a.read.Do("GET", "/v1/policies/unknown", nil), 404, "not_found", "unknown during outage")
	expect(t, a.read.Do("GET", "/v1/policies/p?wait=100ms", nil, "If-None-Match", got.ETag()), 304, "long poll during outage")
	// A long poll held across the outage, on the other replica.
	otherTag := other.read.Do("GET", "/v1/policies/p", nil).ETag()
	held := poll(other.read, "/v1/policies/p?wait=20s", "If-None-Match", otherTag)
	time.Sleep(300 * time.Millisecond) // let the writers hit the outage too

	b.redis.Restart()
	waitStatus(t, a.anon, "/readyz", 200)
	waitStatus(t, other.anon, "/readyz", 200)
	for n := ackedCount(); ackedCount() < n+5; {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	// The held poll was woken by a write after the restart (possibly through
	// the other replica, whose notice it may have missed while reconnecting).
	woke := await(t, held, "poll held across the outage")
	expect(t, woke, 200, "poll held across the outage")

	final := a.admin.Do("GET", "/v1/policies/p", nil)
	p := decodePolicy(t, final)
	have := map[string]bool{}
	for _, r := range p.Rules {
		have[r.ID] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range acked {
		if !have[id] {
			t.Errorf("acknowledged rule %s lost (policy %s)", id, final.Body)
		}
	}
	// Both replicas agree and writes go on.
	waitETag(t, other.read, "/v1/policies/p", final.ETag())
	expect(t, other.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 9), "If-Match", final.ETag()), 200, "write after recovery")
	t.Logf("acknowledged %d writes across the outage", len(acked))
}

func waitETag(t *testing.T, c *apitest.Client, path, tag string) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for time.Now().Before(deadline) {
		if c.Do("GET", path, nil).ETag() == tag {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("GET %s never reached ETag %s", path, tag)
}

// TestRedisDownAtStart: a replica whose store is unreachable at start serves
// 503 (nothing to serve yet), then recovers by itself.
func TestRedisDownAtStart(t *testing.T) {
	b := redisBackend(t, redisproc.Options{})
	seed := startReplica(t, b)
	expect(t, seed.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	b.redis.Kill()
	r := startReplicaUnsynced(t, b)
	expectCode(t, r.read.Do("GET", "/v1/policies/p", nil), 503, "store_unavailable", "read before any snapshot")
	expectCode(t, r.read.Do("GET", "/v1/policies", nil), 503, "store_unavailable", "list before any snapshot")
	expectCode(t, r.anon.Do("GET", "/readyz", nil), 503, "store_unavailable", "readyz")
	b.redis.Restart() // no persistence: the data is gone, but the service recovers
	waitStatus(t, r.anon, "/readyz", 200)
	expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "write after recovery")
}
