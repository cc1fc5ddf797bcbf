package fleetquota

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// quiet keeps the tick's top-ups and reports out of the way of call counts.
const quiet = `,"quota_interval":"1m"`

// fixedHour is a fleet fixed_window rule of limit per hour.
func fixedHour(limit string, extra string) string {
	return fleetPolicy(`"algorithm":"fixed_window","limit":` + limit + `,"window":"1h","scope":"fleet"` + extra)
}

func setupFleet(t *testing.T, policy string, workers int, extra string) (*controlPlane, *quotaProxy, *envoy) {
	t.Helper()
	cp := startControlPlane(t, "")
	v := cp.put(policy)
	qp := newQuotaProxy(t, cp.addr)
	e := startEnvoy(t, qp.addr(), workers, extra, v)
	return cp, qp, e
}

func TestColdKeyPausesForOneCallThenResumes(t *testing.T) {
	_, qp, e := setupFleet(t, fixedHour("100", ""), 1, quiet)
	s, err := e.h.Worker(0).NewStream(host.StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	release := qp.hold()
	st, err := s.RequestHeaders(ctx, host.Headers{{":method", "GET"}, {":path", "/api"}, {":authority", "x"}, {":scheme", "http"}, {"x-user", "alice"}}, true)
	if err != nil || st != host.Paused {
		t.Fatalf("request headers: %v %v, want Paused", st, err)
	}
	if !proctest.WaitFor(5*time.Second, func() bool { return qp.count() == 1 }) {
		t.Fatalf("quota calls %d, want 1", qp.count())
	}
	release()
	st, err = s.Wait(ctx)
	if err != nil || st != host.Continue {
		t.Fatalf("after the answer: %v %v, want Continue", st, err)
	}
	fs := filterstate.Fields(s.FilterState())
	if fs["scope"] != "fleet" || fs["quota"] != "waited" || fs["rate_limited"] != "false" {
		t.Fatalf("filter state %v", fs)
	}
	if err := s.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWarmKeyMakesNoQuotaCall(t *testing.T) {
	_, qp, e := setupFleet(t, fixedHour("1000", ""), 1, quiet)
	first := e.do(0, "alice")
	if first.Status != 200 || filterstate.Fields(first.FilterState)["quota"] != "waited" {
		t.Fatalf("first: %d %v", first.Status, first.FilterState)
	}
	calls := qp.count()
	for i := 0; i < 12; i++ { // the first grant is at least 16 units
		r := e.do(0, "alice")
		if r.Status != 200 || filterstate.Fields(r.FilterState)["quota"] != "local" || filterstate.Fields(r.FilterState)["scope"] != "fleet" {
			t.Fatalf("request %d: %d %v", i, r.Status, r.FilterState)
		}
	}
	if got := qp.count(); got != calls {
		t.Fatalf("quota calls went from %d to %d on a warm key", calls, got)
	}
}

func TestWaitersOnOneKeyShareOneCall(t *testing.T) {
	_, qp, e := setupFleet(t, fixedHour("1000", ""), 2, quiet)
	release := qp.hold()
	ctx := context.Background()
	var streams []*host.Stream
	for i := 0; i < 10; i++ {
		s, err := e.h.Worker(0).NewStream(host.StreamInfo{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.RequestHeaders(ctx, host.Headers{{":method", "GET"}, {":path", "/api"}, {":authority", "x"}, {":scheme", "http"}, {"x-user", "bob"}}, true)
		if err != nil || st != host.Paused {
			t.Fatalf("stream %d: %v %v, want Paused", i, st, err)
		}
		streams = append(streams, s)
	}
	if !proctest.WaitFor(5*time.Second, func() bool { return qp.count() >= 1 }) {
		t.Fatal("no quota call")
	}
	time.Sleep(100 * time.Millisecond) // let a wrong second call show
	if got := qp.count(); got != 1 {
		t.Fatalf("quota calls %d for one key on one worker, want 1", got)
	}
	release()
	for i, s := range streams {
		st, err := s.Wait(ctx)
		if err != nil || st != host.Continue {
			t.Fatalf("stream %d: %v %v, want Continue", i, st, err)
		}
		if err := s.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := qp.count(); got != 1 {
		t.Fatalf("quota calls %d after the answer, want 1", got)
	}
}

func TestAnswerAfterStreamResetIsIgnored(t *testing.T) {
	_, qp, e := setupFleet(t, fixedHour("1000", ""), 1, quiet)
	release := qp.hold()
	ctx := context.Background()
	s, err := e.h.Worker(0).NewStream(host.StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.RequestHeaders(ctx, host.Headers{{":method", "GET"}, {":path", "/api"}, {":authority", "x"}, {":scheme", "http"}, {"x-user", "carol"}}, true)
	if err != nil || st != host.Paused {
		t.Fatalf("%v %v, want Paused", st, err)
	}
	// The client goes away while the request waits: Envoy logs and destroys
	// the stream.
	if err := s.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	release()
	// The answer lands on a gone stream; the worker still serves, from the
	// lease the answer filled (a request sent before it landed waits for it
	// and is resumed by it).
	var r host.Response
	if !proctest.WaitFor(5*time.Second, func() bool {
		r = e.do(0, "carol")
		return r.Status != 200 || filterstate.Fields(r.FilterState)["quota"] == "local"
	}) || r.Status != 200 {
		t.Fatalf("next request: %d %v", r.Status, r.FilterState)
	}
	if got := qp.count(); got != 1 {
		t.Fatalf("quota calls %d, want 1", got)
	}
	if s.LocalReply() != nil {
		t.Fatal("the gone stream was answered")
	}
}

func TestFleetLimitIsExactAcrossEnvoys(t *testing.T) {
	cp := startControlPlane(t, "")
	v := cp.put(fixedHour("30", ""))
	qp := newQuotaProxy(t, cp.addr)
	envoys := []*envoy{startEnvoy(t, qp.addr(), 2, quiet, v), startEnvoy(t, qp.addr(), 2, quiet, v)}
	admitted := 0
	for i := 0; i < 100; i++ {
		r := envoys[i%2].do(i/2%2, "dave")
		switch r.Status {
		case 200:
			admitted++
		case 429:
			if filterstate.Fields(r.FilterState)["rate_limited"] != "true" || filterstate.Fields(r.FilterState)["scope"] != "fleet" {
				t.Fatalf("denial filter state %v", r.FilterState)
			}
		default:
			t.Fatalf("status %d", r.Status)
		}
	}
	if admitted != 30 {
		t.Fatalf("admitted %d across two Envoys, want exactly 30", admitted)
	}
	if r := envoys[0].do(0, "erin"); r.Status != 200 {
		t.Fatalf("another user: %d", r.Status)
	}
}

func TestQuotaFailureDegradesAsTheRuleSays(t *testing.T) {
	faults := map[string]func(w http.ResponseWriter) bool{
		"down": func(w http.ResponseWriter) bool {
			http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
			return true
		},
		"slow": func(w http.ResponseWriter) bool { time.Sleep(600 * time.Millisecond); return false },
		"malformed": func(w http.ResponseWriter) bool {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"policy":"default","version":1,"keys":[{"key":1}]`))
			return true
		},
		"oversized": func(w http.ResponseWriter) bool {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"policy":"` + strings.Repeat("x", 2<<20) + `"}`))
			return true
		},
	}
	modes := []struct {
		name, members string
		// statuses is what four requests get.
		statuses [4]int
	}{
		{"pass", `,"on_quota_failure":"pass"`, [4]int{200, 200, 200, 200}},
		{"deny", `,"on_quota_failure":"deny"`, [4]int{429, 429, 429, 429}},
		{"local", `,"local_share":0.5`, [4]int{200, 200, 429, 429}},
	}
	for fname, fault := range faults {
		for _, m := range modes {
			t.Run(fname+"/"+m.name, func(t *testing.T) {
				_, qp, e := setupFleet(t, fixedHour("4", m.members), 1, `,"quota_timeout":"200ms"`+quiet)
				qp.setFault(fault)
				for i, want := range m.statuses {
					r := e.do(0, "frank")
					if r.Status != want {
						t.Fatalf("request %d: %d, want %d (%v)", i, r.Status, want, r.FilterState)
					}
					if filterstate.Fields(r.FilterState)["reason"] != "quota_unavailable" || filterstate.Fields(r.FilterState)["quota"] != "degraded" {
						t.Fatalf("request %d: filter state %v", i, r.FilterState)
					}
				}
				if got := e.metric("sluice.quota.failures", 1); got < 1 {
					t.Fatalf("sluice.quota.failures %d", got)
				}
				if fname == "malformed" || fname == "oversized" {
					if got := e.metric("sluice.quota.bad_answers", 1); got != 1 {
						t.Fatalf("sluice.quota.bad_answers %d, want 1", got)
					}
				}
				if got := qp.count(); got != 1 {
					t.Fatalf("quota calls %d during one quota_interval, want 1", got)
				}
			})
		}
	}
}

func TestScopeChangesUnderTraffic(t *testing.T) {
	envoyRule := fleetPolicy(`"algorithm":"fixed_window","limit":10000000,"window":"1h"`)
	fleetRule := fleetPolicy(`"algorithm":"fixed_window","limit":10000000,"window":"1h","scope":"fleet"`)
	cp := startControlPlane(t, "")
	v := cp.put(envoyRule)
	qp := newQuotaProxy(t, cp.addr)
	e := startEnvoy(t, qp.addr(), 2, `,"quota_interval":"100ms"`, v)

	stop := make(chan struct{})
	done := make(chan error, 2)
	for w := 0; w < 2; w++ {
		go func(w int) {
			for {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				r, err := e.h.Worker(w).Do(context.Background(), host.Request{Path: "/api", Headers: host.Headers{{"x-user", "gina"}}})
				if err != nil {
					done <- err
					return
				}
				if r.Status != 200 {
					done <- &statusError{r.Status, r.FilterState}
					return
				}
				time.Sleep(time.Millisecond)
			}
		}(w)
	}
	scopeIs := func(want string) {
		t.Helper()
		var r host.Response
		if !proctest.WaitFor(20*time.Second, func() bool {
			for w := 0; w < 2; w++ {
				r = e.do(w, "gina")
				if r.Status != 200 || filterstate.Fields(r.FilterState)["scope"] != want {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("scope never became %q: last %d %v", want, r.Status, r.FilterState)
		}
	}
	for i, doc := range []string{fleetRule, envoyRule, fleetRule} {
		cp.put(doc)
		if i%2 == 0 {
			scopeIs("fleet")
		} else {
			scopeIs("") // envoy-scoped rules write no sluice.scope
		}
	}
	close(stop)
	for w := 0; w < 2; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if qp.count() == 0 {
		t.Fatal("no quota call while the rule was fleet-scoped")
	}
}

type statusError struct {
	status int
	state  map[string]string
}

func (e *statusError) Error() string {
	return "status " + http.StatusText(e.status) + " with filter state " + strings.Join(stateList(e.state), " ")
}

func stateList(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// TestLongKeyPartsAreEnforcedLikeShortOnes: a user id of 2 KB or 60 KB (Envoy's
// default header limit) takes the fleet path every short one takes: its key part is
// reduced to a fixed-size digest, the key travels to the quota service, and two
// Envoys admit exactly the limit between them, whatever on_quota_failure says.
func TestLongKeyPartsAreEnforcedLikeShortOnes(t *testing.T) {
	for _, size := range []int{2 << 10, 60 << 10} {
		for _, onFailure := range []string{"pass", "deny"} {
			t.Run(strconv.Itoa(size)+"/"+onFailure, func(t *testing.T) {
				cp := startControlPlane(t, "")
				v := cp.put(fixedHour("5", `,"on_quota_failure":"`+onFailure+`"`))
				qp := newQuotaProxy(t, cp.addr)
				envoys := []*envoy{startEnvoy(t, qp.addr(), 1, quiet, v), startEnvoy(t, qp.addr(), 1, quiet, v)}
				user := strings.Repeat("u", size-1) + "1"
				admitted := 0
				for i := 0; i < 12; i++ {
					r := envoys[i%2].do(0, user)
					if f := filterstate.Fields(r.FilterState); f["quota"] == "degraded" {
						t.Fatalf("request %d: status %d, quota degraded (%s)", i, r.Status, f["reason"])
					}
					if r.Status == 200 {
						admitted++
					}
				}
				if admitted != 5 {
					t.Fatalf("admitted %d of a %d-byte user across two Envoys, want exactly 5", admitted, size)
				}
				if qp.count() == 0 {
					t.Fatal("no quota call for a long key")
				}
				// Another long id, differing only in its last byte, is another key.
				if r := envoys[0].do(0, user[:size-1]+"2"); r.Status != 200 {
					t.Fatalf("a second long user: %d (quota %s)", r.Status, filterstate.Fields(r.FilterState)["quota"])
				}
			})
		}
	}
}

func TestIdleKeyReturnsItsUnits(t *testing.T) {
	_, qp, e := setupFleet(t, fixedHour("100", ""), 2, `,"quota_interval":"50ms"`)
	if r := e.do(0, "judy"); r.Status != 200 || filterstate.Fields(r.FilterState)["quota"] != "waited" {
		t.Fatalf("%d %v", r.Status, r.FilterState)
	}
	// 16 granted, 1 spent (reported on the next interval): after three idle
	// intervals a report gives the other 15 back.
	returned := func() bool {
		qp.mu.Lock()
		defer qp.mu.Unlock()
		for _, b := range qp.bodies {
			if strings.Contains(b, `"return":15,"want":0`) {
				return true
			}
		}
		return false
	}
	if !proctest.WaitFor(10*time.Second, returned) {
		qp.mu.Lock()
		t.Fatalf("no return of the 15 unused units; calls: %v", qp.bodies)
	}
}

// TestEnvoysSharingANodeIDAreTwoQuotaClients: a static bootstrap often gives
// every replica the same node.id; the quota service must still see two Envoys
// (each holds its own leases), and the node id stays readable in their ids.
func TestEnvoysSharingANodeIDAreTwoQuotaClients(t *testing.T) {
	cp := startControlPlane(t, "")
	v := cp.put(fixedHour("30", ""))
	qp := newQuotaProxy(t, cp.addr)
	envoys := []*envoy{
		startEnvoyNode(t, qp.addr(), 1, quiet, v, "edge"),
		startEnvoyNode(t, qp.addr(), 1, quiet, v, "edge"),
	}
	admitted := 0
	for i := 0; i < 40; i++ {
		if envoys[i%2].do(0, "frank").Status == 200 {
			admitted++
		}
	}
	if admitted != 30 {
		t.Errorf("admitted %d across two Envoys, want exactly 30", admitted)
	}
	ids := qp.envoys()
	if len(ids) != 2 {
		t.Fatalf("quota calls came from envoy ids %v; want two distinct ids", ids)
	}
	for id := range ids {
		if !strings.HasPrefix(id, "edge~") {
			t.Errorf("envoy id %q does not start with the node id", id)
		}
	}
}

// TestNoQuotaAnswerWithoutSpentBudgetDenies: a key the service answers retry (it
// could not decide in time), and a request that waited its three rounds while
// every grant vanished before it could spend it (here: leases that end at once),
// are decided by on_quota_failure: passed with pass, denied only with deny. The
// budget is not known to be spent, so no 429 comes from the quota itself.
func TestNoQuotaAnswerWithoutSpentBudgetDenies(t *testing.T) {
	answers := map[string]func(k quota.KeyRequest) quota.KeyResult{
		"retry": func(k quota.KeyRequest) quota.KeyResult {
			return quota.KeyResult{Key: k.Key, Status: quota.StatusRetry, RetryAfter: 5 * time.Millisecond}
		},
		"grants that end at once": func(k quota.KeyRequest) quota.KeyResult {
			return quota.KeyResult{Key: k.Key, Status: quota.StatusGranted, Granted: 1, Held: 1, ExpiresIn: time.Nanosecond}
		},
	}
	for name, answer := range answers {
		for _, m := range []struct{ mode, members string }{{"pass", `,"on_quota_failure":"pass"`}, {"deny", `,"on_quota_failure":"deny"`}} {
			t.Run(name+"/"+m.mode, func(t *testing.T) {
				_, qp, e := setupFleet(t, fixedHour("100", m.members), 1, quiet)
				qp.setAnswer(func(req *quota.Request) *quota.Response {
					resp := &quota.Response{Policy: req.Policy, Version: req.Version}
					for _, k := range req.Keys {
						resp.Keys = append(resp.Keys, answer(k))
					}
					return resp
				})
				r := e.do(0, "gina")
				fs := filterstate.Fields(r.FilterState)
				want := 200
				if m.mode == "deny" {
					want = 429
				}
				if r.Status != want || fs["quota"] != "degraded" || fs["reason"] != "quota_unavailable" {
					t.Fatalf("status %d, filter state %v; want %d decided by on_quota_failure %s", r.Status, r.FilterState, want, m.mode)
				}
			})
		}
	}
}
