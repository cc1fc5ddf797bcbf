package rulesync

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisproc"
	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
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
// and then restarts empty. The writes made afterwards get versions 1..3
// again; every worker enforces each of them, not the lost version 3.
func TestFilterFollowsStoreThatLostWrites(t *testing.T) {
	redis := redisproc.Start(t)
	cp := startControlPlane(t, redis.Addr())
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
	ok := proctest.WaitFor(20*time.Second, func() bool {
		for i := range workers {
			if e.version(i) != "3" {
				e.advance()
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatal("the workers do not enforce version 3")
	}
	if got := e.admitted("/b", 8); got != 5 {
		t.Errorf("after the loss rule b admitted %d of 8, want 5 (the new version 3); logs:\n%s", got, strings.Join(logLines(e), "\n"))
	}
}

func logLines(e *envoy) []string {
	var out []string
	for _, l := range e.logsWith("policysync") {
		out = append(out, l.Message)
	}
	return out
}
