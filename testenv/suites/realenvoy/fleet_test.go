package realenvoy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// fleetLimit is L, the fleet rule's limit per window (an hour: every count
// below falls in one window).
const fleetLimit = 300

// fleetPolicy limits /fleet/ per user to fleetLimit an hour across every
// Envoy; its rule "probe" matches awaitVersion's probes, which carry no user
// and so are decided (and logged with the version) without being counted.
var fleetPolicy = `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"probe","match":{"path_prefix":"/reports/"},"key":["user"],"algorithm":"fixed_window","limit":1,"window":"1h"},` +
	`{"id":"fleet-user","match":{"path_prefix":"/fleet/"},"key":["user"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(fleetLimit) + `,"window":"1h","scope":"fleet"}]}`

// fleet is three proxies of one kind, two control-plane replicas on one
// redis-server (no persistence: a restart empties it), proxy i polling and
// leasing from replica i mod 2.
type fleet struct {
	redis   *redisproc.Server
	cps     []*controlPlane
	proxies []*proxy
	killed  map[int]bool
}

func startFleet(t *testing.T, kind string) *fleet {
	t.Helper()
	f := &fleet{redis: redisproc.Start(t), killed: map[int]bool{}}
	for i := 0; i < 2; i++ {
		f.cps = append(f.cps, startControlPlane(t, "control plane "+strconv.Itoa(i),
			"--redis-url", f.redis.URL(), "--resync-interval", "200ms"))
	}
	v := proctest.PutPolicy(t, f.cps[0].addr, "default", adminToken, fleetPolicy)
	f.startProxies(t, kind, v, "envoy/envoy.yaml", func(int) (map[string]string, []string) { return nil, nil })
	return f
}

// startProxies starts the three proxies on config; files gives proxy i's
// filename rewrites and environment.
func (f *fleet) startProxies(t *testing.T, kind string, v uint64, config string, files func(i int) (map[string]string, []string)) {
	t.Helper()
	up := startUpstream(t)
	for i := 0; i < 3; i++ {
		rw, env := files(i)
		p := startProxy(t, kind, proxySpec{name: "fleet-" + strconv.Itoa(i), config: config, upstream: up,
			clusters: map[string]string{"control_plane": f.cps[i%2].addr}, files: rw, env: env})
		awaitVersion(t, p, v)
		f.proxies = append(f.proxies, p)
	}
}

// send sends n requests of user to /fleet/ over the live proxies in turn and
// returns how many the clients saw admitted. Any status but 200 or 429 fails
// the test.
func (f *fleet) send(t *testing.T, user string, n int) int {
	t.Helper()
	var live []*proxy
	for i, p := range f.proxies {
		if !f.killed[i] {
			live = append(live, p)
		}
	}
	admitted := 0
	for i := 0; i < n; i++ {
		switch r := live[i%len(live)].do(t, "GET", "/fleet/items", "X-User-Id", user); r.status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d of %s: %d %s", i, user, r.status, r.body)
		}
	}
	return admitted
}

// logged counts, in every proxy's access log, the requests of user that
// fleet-user decided and that were admitted: what the Envoys themselves
// recorded, independent of what the clients saw.
func (f *fleet) logged(t *testing.T, user string) (admitted, decided int) {
	t.Helper()
	key := "user=" + user + ":"
	for _, p := range f.proxies {
		for _, line := range envoyproc.ReadJSONLines(t, p.accessLog) {
			rl, err := filterstate.FromLogLine(line)
			if err != nil || rl["rule"] != "fleet-user" || !strings.Contains(rl["key"], key) {
				continue
			}
			decided++
			if line["status_code"] == 200.0 {
				admitted++
			}
		}
	}
	return admitted, decided
}

// awaitLogged waits until the proxies' logs hold n decisions of user (file
// access logs are flushed every 100 ms) and returns the admitted count.
func (f *fleet) awaitLogged(t *testing.T, user string, n int) int {
	t.Helper()
	var admitted, decided int
	proctest.WaitFor(10*time.Second, func() bool {
		admitted, decided = f.logged(t, user)
		return decided >= n
	})
	if decided != n {
		t.Fatalf("%d decisions of %s logged, want %d", decided, user, n)
	}
	return admitted
}

// TestAFleetRuleHoldsAcrossThreeEnvoys: three real Envoys (and, alike, three
// dev proxies), two control-plane replicas, one Redis. Counted from the proxies'
// own access logs:
//   - while budget remains every request is admitted, and in all exactly L;
//   - with one Envoy killed by SIGKILL mid-window (its unspent lease lost until
//     the window ends) the other two never take the fleet past L;
//   - with Redis restarted empty mid-window, the window admits at most 2 L (the
//     bound docs/api.md states: leases already held, plus L granted afresh).
func TestAFleetRuleHoldsAcrossThreeEnvoys(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			f := startFleet(t, kind)

			// Exact while budget remains, exactly L in all.
			if got := f.send(t, "exact", fleetLimit); got != fleetLimit {
				t.Errorf("the first %d requests: %d admitted, want all (budget remained)", fleetLimit, got)
			}
			f.send(t, "exact", 300)
			if got := f.awaitLogged(t, "exact", fleetLimit+300); got != fleetLimit {
				t.Errorf("%d requests over three proxies: the logs show %d admitted, want exactly %d", fleetLimit+300, got, fleetLimit)
			}

			// An Envoy killed holding a lease.
			f.send(t, "kill", 90)
			f.proxies[2].proc.Kill()
			f.killed[2] = true
			f.send(t, "kill", 600)
			admitted, decided := f.logged(t, "kill")
			if admitted > fleetLimit {
				t.Errorf("with one proxy killed: %d admitted of %d decided, over L = %d", admitted, decided, fleetLimit)
			}
			t.Logf("one proxy killed after 90 requests: %d admitted in the window (L = %d)", admitted, fleetLimit)

			// Redis restarted empty mid-window.
			f.send(t, "loss", 200)
			f.redis.Restart()
			for _, cp := range f.cps {
				proctest.AwaitHTTP(t, "http://"+cp.addr+"/readyz", readyTimeout, cp.Proc)
			}
			f.send(t, "loss", 800)
			admitted = f.awaitLogged(t, "loss", 1000)
			if admitted > 2*fleetLimit {
				t.Errorf("Redis restarted empty mid-window: %d admitted, over 2 L = %d", admitted, 2*fleetLimit)
			}
			t.Logf("Redis restarted empty after 200 requests: %d of 1000 admitted in the window (bound 2 L = %d)", admitted, 2*fleetLimit)
			if admitted < fleetLimit {
				t.Errorf("Redis restarted empty: %d admitted, fewer than the %d before the loss could have left", admitted, fleetLimit)
			}
		})
	}
}
