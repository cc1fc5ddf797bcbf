package rulesync

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// putUntilAcknowledged is controlPlane.put, retried while the control plane
// answers 503 (its Redis connections are being re-established).
func (c *controlPlane) putUntilAcknowledged(doc string) uint64 {
	c.t.Helper()
	ok := proctest.WaitFor(cpReadyTimeout, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+c.addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ok {
		c.t.Fatal("the control plane is not ready")
	}
	for range 20 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+c.addr+"/v1/policies/"+policyName+"/versions", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c.put(doc)
}

// TestFilterFollowsStoreThatLostWrites: Redis without persistence
// acknowledges versions 1..3 of the policy, which every worker enforces,
// and then restarts empty, under a control plane that does not write lost
// policies back. The writes made afterwards get versions 1..3 again; every
// worker enforces each of them, not the lost version 3.
func TestFilterFollowsStoreThatLostWrites(t *testing.T) {
	redis := redisproc.Start(t)
	cp := startControlPlane(t, redis.Addr(), "--restore-lost-policies=false")
	e := startEnvoy(t, cp.addr, nil, 30*time.Second)

	for i, la := range []int{100, 101, 102} {
		if v := cp.put(twoRules(la, 1)); v != uint64(i+1) {
			t.Fatalf("write %d got version %d", i, v)
		}
	}
	e.awaitVersion(3, 10*time.Second)
	if got := e.admitted("/b", 3); got != 1 {
		t.Fatalf("before the loss rule b admitted %d of 3, want 1", got)
	}

	redis.Restart() // no persistence: empty

	for i, lb := range []int{2, 3, 5} {
		v := cp.putUntilAcknowledged(twoRules(100, lb))
		if v != uint64(i+1) {
			t.Fatalf("write %d after the loss got version %d, want %d", i, v, i+1)
		}
		if i == 0 {
			e.awaitVersion(1, 20*time.Second)
		}
	}
	// Version 3 again, with rule b at 5 per hour (a new counter): every
	// worker enforces it, not the lost version 3 (rule b at 1).
	e.awaitAllVersion("3", 20*time.Second)
	if got := e.admitted("/b", 8); got != 5 {
		t.Errorf("after the loss rule b admitted %d of 8, want 5 (the new version 3); logs:\n%s", got, strings.Join(logLines(e), "\n"))
	}
}

// TestFilterFollowsRestoredPolicy: the same loss under a control plane that
// writes lost policies back (the default). With nobody re-applying it, the
// store gets the last version served back as version 1 of a new epoch, and
// every worker moves to it; the next write is version 2 and is enforced.
func TestFilterFollowsRestoredPolicy(t *testing.T) {
	redis := redisproc.Start(t)
	cp := startControlPlane(t, redis.Addr())
	e := startEnvoy(t, cp.addr, nil, 30*time.Second)
	for i, la := range []int{100, 101, 102} {
		if v := cp.put(twoRules(la, 1)); v != uint64(i+1) {
			t.Fatalf("write %d got version %d", i, v)
		}
	}
	e.awaitVersion(3, 10*time.Second)

	redis.Restart() // no persistence: empty

	e.awaitAllVersion("1", 20*time.Second)
	if v := cp.putUntilAcknowledged(twoRules(100, 5)); v != 2 {
		t.Fatalf("the write after the restore got version %d, want 2", v)
	}
	e.awaitAllVersion("2", 20*time.Second)
	if got := e.admitted("/b", 8); got != 5 {
		t.Errorf("rule b admitted %d of 8, want 5 (version 2); logs:\n%s", got, strings.Join(logLines(e), "\n"))
	}
}

// awaitAllVersion waits until every worker enforces version v.
func (e *envoy) awaitAllVersion(v string, limit time.Duration) {
	e.t.Helper()
	ok := proctest.WaitFor(limit, func() bool {
		for i := range workers {
			if e.version(i) != v {
				e.advance()
				return false
			}
		}
		return true
	})
	if !ok {
		e.t.Fatalf("the workers do not enforce version %s", v)
	}
}

func logLines(e *envoy) []string {
	var out []string
	for _, l := range e.logsWith("policysync") {
		out = append(out, l.Message)
	}
	return out
}
