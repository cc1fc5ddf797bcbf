package realenvoy

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// quotaSwitch stands in front of the control plane for one proxy's
// control_plane cluster: it forwards everything, or, while cut, answers the
// proxy's quota calls 503 as Envoy answers for a cluster it cannot reach (rule
// sync goes on: the proxy keeps its policy either way).
type quotaSwitch struct {
	srv   *httptest.Server
	cut   atomic.Bool
	calls atomic.Int64 // quota calls forwarded
}

func startQuotaSwitch(t *testing.T, target string) *quotaSwitch {
	t.Helper()
	q := &quotaSwitch{}
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	q.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/quota" && q.cut.Load() {
			http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == "/v1/quota" {
			q.calls.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(q.srv.Close)
	return q
}

// outageFleet is three proxies of one kind on one control plane (its embedded
// store keeps the count through the outages), each behind its own
// quotaSwitch, enforcing fleetPolicy; its counts come from the proxies' own
// access logs.
type outageFleet struct {
	t        *testing.T
	proxies  []*proxy
	switches []*quotaSwitch
	sent     int // requests of the test's user sent so far
}

func startOutageFleet(t *testing.T, kind string) *outageFleet {
	t.Helper()
	proctest.AwaitOneWindow(t, time.Hour, 3*time.Minute)
	cp := startControlPlane(t, "control plane", "--data-dir", t.TempDir())
	v := proctest.PutPolicy(t, cp.addr, "default", adminToken, fleetPolicy)
	up := startUpstream(t)
	f := &outageFleet{t: t}
	for i := 0; i < 3; i++ {
		sw := startQuotaSwitch(t, cp.addr)
		p := startProxy(t, kind, proxySpec{name: "outage-" + strconv.Itoa(i), config: "envoy/envoy.yaml", upstream: up,
			clusters: map[string]string{"control_plane": sw.srv.Listener.Addr().String()}})
		awaitVersion(t, p, v)
		f.proxies, f.switches = append(f.proxies, p), append(f.switches, sw)
	}
	return f
}

// round sends one request of user to each proxy in want (nil: all) and
// returns which were admitted.
func (f *outageFleet) round(user string, want []int) (admitted [3]bool) {
	f.t.Helper()
	if want == nil {
		want = []int{0, 1, 2}
	}
	for _, i := range want {
		switch r := f.proxies[i].do(f.t, "GET", "/fleet/items", "X-User-Id", user); r.status {
		case http.StatusOK:
			admitted[i] = true
		case http.StatusTooManyRequests:
		default:
			f.t.Fatalf("%s: %d %s", f.proxies[i].name, r.status, r.body)
		}
		f.sent++
	}
	return admitted
}

// decisions reads the decisions of user in proxy i's access log, in order,
// once every request sent so far has been logged somewhere (file access logs
// are flushed every 100 ms): per decision, whether it was admitted and
// whether it was decided without the quota service.
type decision struct{ admitted, degraded bool }

func (f *outageFleet) decisions(user string) [3][]decision {
	f.t.Helper()
	var out [3][]decision
	ok := proctest.WaitFor(10*time.Second, func() bool {
		n := 0
		for i, p := range f.proxies {
			out[i] = out[i][:0]
			for _, line := range envoyproc.ReadJSONLines(f.t, p.accessLog) {
				rl, err := filterstate.FromLogLine(line)
				if err != nil || rl["rule"] != "fleet-user" || rl["key"] == "" || !containsUser(rl["key"], user) {
					continue
				}
				out[i] = append(out[i], decision{admitted: line["status_code"] == 200.0, degraded: rl["quota"] == "degraded"})
			}
			n += len(out[i])
		}
		return n >= f.sent
	})
	if !ok {
		f.t.Fatalf("the access logs hold fewer decisions of %s than the %d requests sent", user, f.sent)
	}
	return out
}

func containsUser(key, user string) bool {
	needle := "user=" + user + ":"
	for i := 0; i+len(needle) <= len(key); i++ {
		if key[i:i+len(needle)] == needle {
			return true
		}
	}
	return false
}

// counts sums decisions per proxy: admitted, and admitted without the quota
// service.
func counts(ds [3][]decision) (admitted, local [3]int) {
	for i := range ds {
		for _, d := range ds[i] {
			if d.admitted {
				admitted[i]++
				if d.degraded {
					local[i]++
				}
			}
		}
	}
	return admitted, local
}

// join sends one round, then waits until every proxy has reported its use
// (a quota call on its next tick), so that each has heard from the service
// that three share user's key (a cut-off proxy then admits a third of L by
// itself).
func (f *outageFleet) join(user string) {
	f.t.Helper()
	f.round(user, nil)
	var after [3]int64
	for i, sw := range f.switches {
		after[i] = sw.calls.Load()
	}
	if !proctest.WaitFor(20*time.Second, func() bool {
		for i, sw := range f.switches {
			if sw.calls.Load() < after[i]+1 {
				return false
			}
		}
		return true
	}) {
		f.t.Fatal("the proxies never called the quota service again")
	}
}

// cutUntilLocal cuts the proxies in cut off the quota service and sends
// requests to those of them that have admitted fewer than n by themselves,
// ten each at a time, at most maxRounds each (the others wait: brief means
// less than the budget that remains); then it reconnects them, waits for each
// to call the service, and sends a round every poll until each proxy's last
// decision was made with the service again.
func (f *outageFleet) cutUntilLocal(user string, cut []int, n, maxRounds int) {
	f.t.Helper()
	for _, i := range cut {
		f.switches[i].cut.Store(true)
	}
	done := false
	for r := 0; r < maxRounds && !done; r += 10 {
		_, local := counts(f.decisions(user))
		var short []int
		for _, i := range cut {
			if local[i] < n {
				short = append(short, i)
			}
		}
		if done = len(short) == 0; done {
			break
		}
		for k := 0; k < 10; k++ {
			f.round(user, short)
		}
	}
	if !done {
		_, local := counts(f.decisions(user))
		f.t.Fatalf("while cut off, proxies %v admitted %v by themselves in %d rounds, want %d each", cut, local, maxRounds, n)
	}
	// Reconnected, each cut proxy reports what it admitted by itself on its
	// next tick (a call the switch forwards); its workers then ask again.
	var before [3]int64
	for _, i := range cut {
		before[i] = f.switches[i].calls.Load()
		f.switches[i].cut.Store(false)
	}
	if !proctest.WaitFor(20*time.Second, func() bool {
		for _, i := range cut {
			if f.switches[i].calls.Load() == before[i] {
				return false
			}
		}
		return true
	}) {
		f.t.Fatal("a reconnected proxy never called the quota service")
	}
	if !proctest.WaitFor(20*time.Second, func() bool {
		f.round(user, nil)
		ds := f.decisions(user)
		for i := range ds {
			if d := ds[i]; len(d) == 0 || d[len(d)-1].degraded {
				return false
			}
		}
		return true
	}) {
		f.t.Fatal("the proxies still decide by themselves after the quota service is back")
	}
}

// drain sends rounds until every proxy was denied three rounds in a row (the
// budget is spent everywhere), at most maxRounds.
func (f *outageFleet) drain(user string, maxRounds int) {
	f.t.Helper()
	denied := 0
	for r := 0; r < maxRounds && denied < 3; r++ {
		if a := f.round(user, nil); a == [3]bool{} {
			denied++
		} else {
			denied = 0
		}
	}
	if denied < 3 {
		f.t.Fatalf("the proxies were still admitting after %d rounds", maxRounds)
	}
}

// TestABriefOutageLeavesAFleetWindowItsLimit: three real Envoys (and, alike,
// three dev proxies) share a user's key of L = 300 an hour through one control
// plane, the shipped envoy.yaml, even demand. Counted from the proxies' own
// access logs:
//   - every proxy loses the quota service for a while and admits by itself,
//     then reaches it again: the window admits L, at least 0.98 L and never
//     more;
//   - one proxy loses it alone: the window admits L, and the two never cut
//     off keep about their thirds.
func TestABriefOutageLeavesAFleetWindowItsLimit(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			f := startOutageFleet(t, kind)
			check := func(what, user string, healthy []int) {
				t.Helper()
				admitted, local := counts(f.decisions(user))
				total := admitted[0] + admitted[1] + admitted[2]
				t.Logf("%s: admitted %v (%d in all; by themselves while cut off %v), L = %d", what, admitted, total, local, fleetLimit)
				if total > fleetLimit || total < fleetLimit*98/100 {
					t.Errorf("%s: the window admitted %d, want L = %d (at least %d) with demand left, never more", what, total, fleetLimit, fleetLimit*98/100)
				}
				// About a third each with even demand (the service sizes each
				// grant, it does not cap an Envoy at a third); the per-Envoy
				// debt left them a tenth.
				for _, i := range healthy {
					if admitted[i] < fleetLimit/3*8/10 {
						t.Errorf("%s: proxy %d, never cut off, admitted %d, want about its third of %d (at least %d)", what, i, admitted[i], fleetLimit, fleetLimit/3*8/10)
					}
				}
			}

			f.join("all")
			f.cutUntilLocal("all", []int{0, 1, 2}, 5, 150)
			f.drain("all", 3*fleetLimit)
			check("every proxy cut off briefly", "all", nil)

			f.sent = 0
			f.join("alone")
			f.cutUntilLocal("alone", []int{0}, 10, 150)
			f.drain("alone", 3*fleetLimit)
			check("one proxy cut off alone", "alone", []int{1, 2})
		})
	}
}

// TestAnEnvoyRestartedMidWindowAdmitsNothingUncounted: three real Envoys (and,
// alike, three dev proxies) spend a fleet rule's window (L = 300 an hour);
// one is killed (SIGKILL) and started again at once, and takes requests as
// soon as it answers /ready, before its filter has pulled the policy. Those
// requests are held for the first policy (first_policy_wait) and decided by
// it, not passed uncounted by fail_mode: counted from every proxy's access
// log, the window admits exactly L, and no decision says no_policy.
func TestAnEnvoyRestartedMidWindowAdmitsNothingUncounted(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			proctest.AwaitOneWindow(t, time.Hour, 3*time.Minute)
			f := startFleet(t, kind)
			f.send(t, "restart", fleetLimit+60)
			// Logged before the kill: an access log flushes every second or so,
			// and a SIGKILL loses what it has not written.
			f.awaitLogged(t, "restart", fleetLimit+60)
			f.proxies[2].proc.Kill()
			up := startUpstream(t)
			p := startProxy(t, kind, proxySpec{name: "fleet-2-again", config: "envoy/envoy.yaml", upstream: up,
				clusters: map[string]string{"control_plane": f.cps[0].addr}})
			f.proxies = append(f.proxies, p) // its log counts too; the killed one's stays
			f.killed[2] = true
			for i := 0; i < 30; i++ {
				if r := p.do(t, "GET", "/fleet/items", "X-User-Id", "restart"); r.status != http.StatusTooManyRequests {
					t.Errorf("request %d to the restarted proxy: %d, want 429 (the window is spent)", i, r.status)
				}
			}
			admitted := f.awaitLogged(t, "restart", fleetLimit+60+30)
			if admitted != fleetLimit {
				t.Errorf("%d admitted in the window with a proxy restarted, want exactly L = %d", admitted, fleetLimit)
			}
			for _, line := range envoyproc.ReadJSONLines(t, p.accessLog) {
				if rl, err := filterstate.FromLogLine(line); err == nil && rl["reason"] == "no_policy" {
					t.Fatalf("the restarted proxy passed a request without its policy: %v", line)
				}
			}
		})
	}
}
