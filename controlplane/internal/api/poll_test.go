package api_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// guard bounds how long a test waits for something that should happen
// promptly; it only turns a hang into a failure, it asserts no timing.
const guard = 15 * time.Second

// poll starts a long poll and returns its eventual response.
func poll(c *apitest.Client, path string, headers ...string) <-chan *apitest.Response {
	ch := make(chan *apitest.Response, 1)
	go func() { ch <- c.Do("GET", path, nil, headers...) }()
	return ch
}

func await(t *testing.T, ch <-chan *apitest.Response, what string) *apitest.Response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(guard):
		t.Fatalf("%s: no answer within %s", what, guard)
		return nil
	}
}

// waitWatchers waits until the server has n long polls open.
func waitWatchers(t *testing.T, r *replica, n int) {
	t.Helper()
	want := []byte(fmt.Sprintf("sluice_controlplane_watchers %d\n", n))
	deadline := time.Now().Add(guard)
	for time.Now().Before(deadline) {
		if m := r.anon.Do("GET", "/metrics", nil); contains(m.Body, want) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never saw %d watchers", n)
}

func contains(b, sub []byte) bool {
	return string(sub) == "" || len(b) >= len(sub) && indexOf(b, sub) >= 0
}

func indexOf(b, sub []byte) int {
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == string(sub) {
			return i
		}
	}
	return -1
}

func TestLongPoll(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := startReplica(t, b)
			v1 := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
			expect(t, v1, 201, "create")

			// A poll with a stale tag answers at once.
			expect(t, r.read.Do("GET", "/v1/policies/p?wait=10s", nil, "If-None-Match", `"v0"`), 200, "stale tag")

			// A poll on the current version is woken by a write, with the new version.
			ch := poll(r.read, "/v1/policies/p?wait=10s", "If-None-Match", v1.ETag())
			waitWatchers(t, r, 1)
			expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 2)), 200, "write")
			got := await(t, ch, "poll after write")
			expect(t, got, 200, "woken poll")
			if p := decodePolicy(t, got); p.Version != 2 || p.Rules[0].Limit != 2 {
				t.Fatalf("woken poll got %s", got.Body)
			}

			// A poll on an unknown policy waits for its creation.
			ch = poll(r.read, "/v1/policies/later?wait=10s")
			waitWatchers(t, r, 1)
			expect(t, r.admin.Do("PUT", "/v1/policies/later", policyDoc("later", 3)), 201, "create later")
			got = await(t, ch, "poll for creation")
			expect(t, got, 200, "poll for creation")
			if p := decodePolicy(t, got); p.Policy != "later" || p.Version != 1 {
				t.Fatalf("creation poll got %s", got.Body)
			}
			later := got.ETag()

			// A deletion wakes a poll: 404.
			ch = poll(r.read, "/v1/policies/later?wait=10s", "If-None-Match", later)
			waitWatchers(t, r, 1)
			expect(t, r.admin.Do("DELETE", "/v1/policies/later", nil), 200, "delete")
			expectCode(t, await(t, ch, "poll on deletion"), 404, "not_found", "poll on deletion")

			// The wait ends: 304 with the ETag (or 404 for a policy that never came).
			v2 := r.read.Do("GET", "/v1/policies/p", nil).ETag()
			expect(t, r.read.Do("GET", "/v1/policies/p?wait=50ms", nil, "If-None-Match", v2), 304, "wait ends")
			expectCode(t, r.read.Do("GET", "/v1/policies/never?wait=50ms", nil), 404, "not_found", "wait ends on unknown")
			expect(t, r.read.Do("GET", "/v1/policies/p?wait=1", nil, "If-None-Match", v2), 304, "wait in seconds")
		})
	}
}

// TestLongPollBoundedByMaxWait: ?wait beyond the maximum is clamped.
func TestLongPollBoundedByMaxWait(t *testing.T) {
	r := startReplica(t, boltBackend(t), func(o *api.Options) { o.MaxWait = 100 * time.Millisecond })
	v1 := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
	expect(t, v1, 201, "create")
	ch := poll(r.read, "/v1/policies/p?wait=1h", "If-None-Match", v1.ETag())
	expect(t, await(t, ch, "clamped poll"), 304, "clamped poll")
}

// TestDrainAnswersLongPolls: shutdown answers open long polls at once (304).
func TestDrainAnswersLongPolls(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	v1 := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
	expect(t, v1, 201, "create")
	const n = 20
	chans := make([]<-chan *apitest.Response, n)
	for i := range chans {
		chans[i] = poll(r.read, "/v1/policies/p?wait=20s", "If-None-Match", v1.ETag())
	}
	waitWatchers(t, r, n)
	r.srv.Drain()
	for i, ch := range chans {
		expect(t, await(t, ch, "drained poll"), 304, fmt.Sprint("drained poll ", i))
	}
	// After draining, polls do not wait.
	expect(t, r.read.Do("GET", "/v1/policies/p?wait=20s", nil, "If-None-Match", v1.ETag()), 304, "poll after drain")
}

// TestReplicasShareRedis: a write through one replica wakes long polls on
// another (pub/sub), and both serve the same versions.
func TestReplicasShareRedis(t *testing.T) {
	b := redisBackend(t, redisproc.Options{})
	a, c := startReplica(t, b), startReplica(t, b)
	v1 := a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1))
	expect(t, v1, 201, "create on a")

	// c learns about p (read-through for an unknown name).
	expect(t, c.read.Do("GET", "/v1/policies/p", nil), 200, "read on c")
	chans := []<-chan *apitest.Response{}
	for i := 0; i < 10; i++ {
		chans = append(chans, poll(c.read, "/v1/policies/p?wait=10s", "If-None-Match", v1.ETag()))
	}
	creation := poll(c.read, "/v1/policies/fresh?wait=10s")
	waitWatchers(t, c, 11)
	v2 := a.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 2))
	expect(t, v2, 200, "write on a")
	for _, ch := range chans {
		got := await(t, ch, "poll on c")
		expect(t, got, 200, "poll on c")
		if p := decodePolicy(t, got); p.Version != 2 {
			t.Fatalf("poll on c got version %d", p.Version)
		}
	}
	expect(t, a.admin.Do("PUT", "/v1/policies/fresh", policyDoc("fresh", 2)), 201, "create fresh on a")
	expect(t, await(t, creation, "creation poll on c"), 200, "creation poll on c")
	// Writes through c see a's writes (If-Match with a's ETag).
	expect(t, c.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 3), "If-Match", v2.ETag()), 200, "write on c")
	expect(t, a.read.Do("GET", "/v1/policies/p?wait=10s", nil, "If-None-Match", v2.ETag()), 200, "a sees c's write")
}

// TestIfMatchRace: two writers with the same ETag; exactly one wins, the
// other gets 412. Repeated, and across two replicas on Redis.
func TestIfMatchRace(t *testing.T) {
	b := redisBackend(t, redisproc.Options{})
	r1, r2 := startReplica(t, b), startReplica(t, b)
	expect(t, r1.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	clients := []*apitest.Client{r1.admin, r2.admin}
	for round := uint64(1); round <= 20; round++ {
		tag := r1.admin.Do("GET", "/v1/policies/p/versions", nil).ETag() // read from the store
		if tagVersion(tag) != round {
			t.Fatalf("round %d: current ETag %s", round, tag)
		}
		var wg sync.WaitGroup
		statuses := make([]int, 2)
		start := make(chan struct{})
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				var resp *apitest.Response
				if i == 0 {
					resp = clients[i].Do("PUT", "/v1/policies/p", policyDoc("p", int(round*10)+i), "If-Match", tag)
				} else {
					resp = clients[i].Do("POST", "/v1/policies/p/rules", ruleDoc(fmt.Sprint("x", round), 1), "If-Match", tag)
				}
				statuses[i] = resp.Status
			}(i)
		}
		close(start)
		wg.Wait()
		ok, failed := 0, 0
		for _, s := range statuses {
			switch s {
			case 200, 201:
				ok++
			case 412:
				failed++
			}
		}
		if ok != 1 || failed != 1 {
			t.Fatalf("round %d: statuses %v, want one success and one 412", round, statuses)
		}
	}
}

// TestConcurrentWritersWithoutIfMatch: all succeed (retried), versions are
// distinct and consecutive.
func TestConcurrentWritersWithoutIfMatch(t *testing.T) {
	r := startReplica(t, redisBackend(t, redisproc.Options{}))
	expect(t, r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 1)), 201, "create")
	const n = 6
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp := r.admin.Do("POST", "/v1/policies/p/rules", ruleDoc(fmt.Sprint("c", i), 1))
			if resp.Status != 201 {
				t.Errorf("writer %d: %d %s", i, resp.Status, resp.Body)
			}
		}(i)
	}
	wg.Wait()
	got := r.admin.Do("GET", "/v1/policies/p", nil)
	if p := decodePolicy(t, got); p.Version != n+1 || len(p.Rules) != n+1 {
		t.Fatalf("after %d writers: version %d, %d rules", n, p.Version, len(p.Rules))
	}
}

var _ = context.Background
