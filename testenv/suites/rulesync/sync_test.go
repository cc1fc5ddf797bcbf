package rulesync

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// Metric names of filter/internal/policysync (not importable from here).
const (
	metricFailures  = "sluice.policy_sync.failures."
	metricSuccesses = "sluice.policy_sync.successes"
	metricLastSync  = "sluice.policy_sync.last_success_seconds"
	metricVersion   = "sluice.policy_version"
)

// TestPutEnforcedByAllWorkers: with no policy traffic passes
// (reason=no_policy); a PUT reaches all four workers; the control plane
// sees one long poll at a time from the Envoy, one per change, not one per
// worker.
func TestPutEnforcedByAllWorkers(t *testing.T) {
	cp := startControlPlane(t, startRedis(t))
	px := newPollProxy(t, cp.addr)
	e := startEnvoy(t, px.addr(), nil, 30*time.Second)

	resp := e.do(0, "/a")
	if resp.Status != 200 || filterstate.Fields(resp.FilterState)["reason"] != "no_policy" {
		t.Fatalf("before any policy: status %d, filter state %v; want 200 with reason=no_policy", resp.Status, resp.FilterState)
	}
	// The lease holder's poll is open before the first PUT.
	if !proctest.WaitFor(10*time.Second, func() bool { _, open, _ := px.counts(); return open == 1 }) {
		t.Fatal("no long poll reached the control plane")
	}

	v1 := cp.put(twoRules(3, 3))
	e.awaitVersion(v1, 10*time.Second)
	if got := e.admitted("/a", 6); got != 3 {
		t.Errorf("rule a (limit 3, shared by all workers) admitted %d of 6", got)
	}
	v2 := cp.put(twoRules(1, 3))
	e.awaitVersion(v2, 10*time.Second)
	// Let the next poll open, then count.
	proctest.WaitFor(5*time.Second, func() bool { total, open, _ := px.counts(); return total >= 3 && open == 1 })
	total, open, maxOpen := px.counts()
	t.Logf("long polls: %d in total, %d open, at most %d open at once", total, open, maxOpen)
	if maxOpen != 1 || open != 1 {
		t.Errorf("%d long polls open at once at most, %d now; want 1 per Envoy, not one per worker", maxOpen, open)
	}
	// One poll before v1, one per change: 3 (a worker per poll would be ≥ 12).
	if total > 4 {
		t.Errorf("%d long polls for 2 changes, want 3", total)
	}
	if n := e.metric(metricFailures + "http_status"); n != 0 {
		t.Errorf("%d http_status failures", n)
	}
	if got := e.metric(metricVersion); got != int64(v2) {
		t.Errorf("%s = %d, want %d", metricVersion, got, v2)
	}
	if e.metric(metricSuccesses) < 2 || e.metric(metricLastSync) < time.Now().Add(-time.Minute).Unix() {
		t.Errorf("successes %d, last sync %d", e.metric(metricSuccesses), e.metric(metricLastSync))
	}
}

// TestLeasePassesWhenHolderKilled: killing the lease holder's worker
// passes the lease to another within the lease expiry (virtual time), and
// the new holder brings the next change to the remaining workers.
func TestLeasePassesWhenHolderKilled(t *testing.T) {
	cp := startControlPlane(t, startRedis(t))
	px := newPollProxy(t, cp.addr)
	vc := host.NewVirtualClock(time.Now())
	e := startEnvoy(t, px.addr(), vc, 30*time.Second)

	holder := e.holder()
	v1 := cp.put(twoRules(3, 3))
	e.awaitVersion(v1, 10*time.Second)
	took := len(e.logsWith("took the sync lease"))

	e.h.Worker(holder).Kill()
	ticks := 0
	for len(e.logsWith("took the sync lease")) == took {
		vc.Advance(tick)
		ticks++
		if ticks > 100 {
			t.Fatal("no worker took the lease within 100 ticks of the holder's death")
		}
	}
	passed := time.Duration(ticks) * tick
	t.Logf("lease passed from worker %d to worker %d after %v of virtual time (lease %v, tick %v)",
		holder, e.holder(), passed, lease, tick)
	if passed > lease+tick {
		t.Errorf("lease passed after %v, want within the lease (%v) plus one tick", passed, lease)
	}
	var live []int
	for i := range workers {
		if i != holder {
			live = append(live, i)
		}
	}
	if nh := e.holder(); nh == holder {
		t.Fatalf("the dead worker %d still took the lease", holder)
	}
	v2 := cp.put(twoRules(3, 4))
	e.awaitVersion(v2, 10*time.Second, live...)
}

// TestControlPlaneOutage: with the control plane down the workers keep
// enforcing the last good policy; once it is back the next change arrives.
func TestControlPlaneOutage(t *testing.T) {
	cp := startControlPlane(t, startRedis(t))
	px := newPollProxy(t, cp.addr)
	v1 := cp.put(twoRules(3, 100))
	e := startEnvoy(t, px.addr(), nil, 30*time.Second)
	e.awaitVersion(v1, 10*time.Second)

	cp.stop()
	if !proctest.WaitFor(10*time.Second, func() bool { return e.metric(metricFailures+"http_status") > 0 }) {
		t.Fatal("the outage was not noticed within 10s")
	}
	time.Sleep(time.Second) // a few failed polls
	if got := e.admitted("/a", 6); got != 3 {
		t.Errorf("during the outage rule a admitted %d of 6, want 3", got)
	}
	for i := range workers {
		if v := e.version(i); v != strconv.FormatUint(v1, 10) {
			t.Errorf("worker %d enforces version %q during the outage, want %d", i, v, v1)
		}
	}

	cp.start()
	v2 := cp.put(twoRules(3, 50))
	e.awaitVersion(v2, 40*time.Second) // the backoff reached at most a few seconds
	failing, recovered := e.logsWith("sync failing"), e.logsWith("sync recovered")
	t.Logf("failures: %d http_status, %d reset; logs: %d 'sync failing', %d 'sync recovered'",
		e.metric(metricFailures+"http_status"), e.metric(metricFailures+"reset"), len(failing), len(recovered))
	if len(failing) != 1 || len(recovered) != 1 {
		t.Errorf("logged 'sync failing' %d times and 'sync recovered' %d times; want once each (per state change)",
			len(failing), len(recovered))
	}
}

// TestInvalidPoliciesRejected: invalid, truncated, oversized and failed
// answers (from a test server standing in for the control plane) are
// rejected and counted by kind; every worker keeps the last good policy.
func TestInvalidPoliciesRejected(t *testing.T) {
	s := newScriptServer(t)
	e := startEnvoy(t, s.addr(), nil, 30*time.Second)
	doc := func(v int, body string) string {
		return `{"policy":"` + policyName + `","version":` + strconv.Itoa(v) + `,"rules":[` + body + `]}`
	}
	good := `{"id":"a","match":{"path_prefix":"/a"},"algorithm":"token_bucket","limit":3,"window":"1h"}`
	s.queue <- scripted{status: 200, etag: `"v1"`, body: doc(1, good)}
	e.awaitVersion(1, 10*time.Second)

	for _, tc := range []struct {
		name string
		resp scripted
		kind string
	}{
		{"truncated JSON", scripted{status: 200, etag: `"v2"`, body: doc(2, good)[:50]}, "invalid_policy"},
		{"cut in transit", scripted{status: 200, etag: `"v3"`, body: doc(3, good)[:50], cut: 100}, "reset"},
		{"invalid rule", scripted{status: 200, etag: `"v4"`, body: doc(4, strings.Replace(good, `"limit":3`, `"limit":0`, 1))}, "invalid_policy"},
		{"unknown member", scripted{status: 200, etag: `"v5"`, body: strings.Replace(doc(5, good), `"rules"`, `"colour":"red","rules"`, 1)}, "invalid_policy"},
		{"another policy", scripted{status: 200, etag: `"v6"`, body: strings.Replace(doc(6, good), policyName, "other", 1)}, "invalid_policy"},
		{"over 1 MiB", scripted{status: 200, etag: `"v7"`, body: doc(7, good) + strings.Repeat(" ", 1<<20)}, "too_large"},
		{"server error", scripted{status: 500, body: "boom"}, "http_status"},
	} {
		before := e.metric(metricFailures + tc.kind)
		s.queue <- tc.resp
		if !proctest.WaitFor(20*time.Second, func() bool { return e.metric(metricFailures+tc.kind) > before }) {
			t.Fatalf("%s: no %s failure counted within 20s", tc.name, tc.kind)
		}
		for i := range workers {
			if v := e.version(i); v != "1" {
				t.Errorf("%s: worker %d enforces version %q, want the last good 1", tc.name, i, v)
			}
		}
	}
	if got := len(e.logsWith("rejected")); got < 5 {
		t.Errorf("%d 'rejected' log lines, want one per rejected document (5)", got)
	}
	s.queue <- scripted{status: 200, etag: `"v8"`, body: doc(8, good)}
	e.awaitVersion(8, 30*time.Second)
}

// TestChangedRuleKeepsOtherCounters: a policy change that alters rule b
// keeps rule a's counter and starts b's afresh, on every worker.
func TestChangedRuleKeepsOtherCounters(t *testing.T) {
	cp := startControlPlane(t, startRedis(t))
	v1 := cp.put(twoRules(3, 3))
	e := startEnvoy(t, cp.addr, nil, 30*time.Second)
	e.awaitVersion(v1, 10*time.Second)
	if a, b := e.admitted("/a", 2), e.admitted("/b", 2); a != 2 || b != 2 {
		t.Fatalf("admitted a %d, b %d of 2 each", a, b)
	}
	v2 := cp.put(twoRules(3, 5))
	e.awaitVersion(v2, 10*time.Second)
	if got := e.admitted("/a", 4); got != 1 {
		t.Errorf("unchanged rule a admitted %d more of 4, want 1 (3 - 2 already used)", got)
	}
	if got := e.admitted("/b", 8); got != 5 {
		t.Errorf("changed rule b admitted %d of 8, want 5 (fresh counter, new limit)", got)
	}
}

// TestStaticPolicyUntilPulled: the static policy of the plugin
// configuration applies until a policy arrives from the control plane,
// which then wins.
func TestStaticPolicyUntilPulled(t *testing.T) {
	cp := startControlPlane(t, startRedis(t))
	static := `"policy":{"policy":"static","rules":[{"id":"a","match":{"path_prefix":"/a"},` +
		`"algorithm":"token_bucket","limit":1,"window":"1h"}]}`
	e := startEnvoyConfig(t, cp.addr, nil, pluginConfig(30*time.Second, static))
	if got := e.admitted("/a", 3); got != 1 {
		t.Errorf("static rule a (limit 1) admitted %d of 3", got)
	}
	if got := e.admitted("/b", 3); got != 3 {
		t.Errorf("/b, which the static policy does not limit, admitted %d of 3", got)
	}
	v := cp.put(twoRules(5, 1))
	e.awaitVersion(v, 10*time.Second)
	if got := e.admitted("/b", 3); got != 1 {
		t.Errorf("pulled rule b (limit 1) admitted %d of 3", got)
	}
	for range 3 {
		e.advance() // ticks: nothing reverts to the static policy
	}
	for i := range workers {
		if got := e.version(i); got != strconv.FormatUint(v, 10) {
			t.Errorf("worker %d enforces version %q, want the pulled %d", i, got, v)
		}
	}
}
