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

// The blip tests' rule: blipLimit per blipWindow per user across the fleet,
// a window short enough that one test sees several.
const (
	blipLimit  = 300
	blipWindow = 12 * time.Second
	// blipDemand is the requests sent per window, over the three Envoys: 3.2 L.
	blipDemand = blipLimit * 16 / 5
	// blipMargin: no request is sent this close to a window's edge, so each
	// is counted in the window the client meant (the path names it).
	blipMargin = 150 * time.Millisecond
	// blipCut is how long a blip keeps Envoys from the quota service.
	blipCut = 3 * time.Second
)

var blipPolicy = `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"probe","match":{"path_prefix":"/reports/"},"key":["user"],"algorithm":"fixed_window","limit":1,"window":"1h"},` +
	`{"id":"blip","match":{"path_prefix":"/fleet/"},"key":["user"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(blipLimit) + `,"window":"` + blipWindow.String() + `","scope":"fleet"}]}`

// blipFleet is three Envoys, two control-plane replicas on one Redis (Envoy i
// polls and leases from replica i mod 2), each Envoy's control_plane cluster
// behind its own quotaSwitch, so that its quota calls can be cut off alone.
type blipFleet struct {
	proxies  []*proxy
	switches []*quotaSwitch
}

func startBlipFleet(t *testing.T) *blipFleet {
	t.Helper()
	rs := redisproc.Start(t)
	var cps []*controlPlane
	for i := 0; i < 2; i++ {
		cps = append(cps, startControlPlane(t, "control plane "+strconv.Itoa(i), "--redis-url", rs.URL()))
	}
	v := proctest.PutPolicy(t, cps[0].addr, "default", adminToken, blipPolicy)
	up := startUpstream(t)
	f := &blipFleet{}
	for i := 0; i < 3; i++ {
		sw := startQuotaSwitch(t, cps[i%2].addr)
		p := startProxy(t, envoyKind, proxySpec{name: "blip-" + strconv.Itoa(i), config: "envoy/envoy.yaml", upstream: up,
			clusters: map[string]string{"control_plane": sw.srv.Listener.Addr().String()}})
		awaitVersion(t, p, v)
		f.proxies, f.switches = append(f.proxies, p), append(f.switches, sw)
	}
	return f
}

// run sends user's demand (blipDemand a window, evenly, over the Envoys in
// turn) through windows windows from the next window's start, cutting the
// Envoys in cut off the quota service for blipCut from cutAt into the second
// window, and returns the requests admitted per window, counted from the
// Envoys' access logs.
func (f *blipFleet) run(t *testing.T, user string, windows int, cut []int, cutAt time.Duration) []int {
	t.Helper()
	start := time.Now().Truncate(blipWindow).Add(blipWindow)
	if !proctest.WaitFor(2*blipWindow, func() bool { return !time.Now().Before(start) }) {
		t.Fatal("the next window never began")
	}
	cutFrom := start.Add(blipWindow + cutAt)
	cutUntil := cutFrom.Add(blipCut)
	period := blipWindow / blipDemand
	tick := time.NewTicker(period)
	defer tick.Stop()
	end := start.Add(time.Duration(windows) * blipWindow)
	sent, isCut := 0, false
	for now := range tick.C {
		if !now.Before(end) {
			break
		}
		if on := !now.Before(cutFrom) && now.Before(cutUntil); on != isCut {
			for _, i := range cut {
				f.switches[i].cut.Store(on)
			}
			isCut = on
		}
		into := now.Sub(start) % blipWindow
		if into < blipMargin || into > blipWindow-blipMargin {
			continue
		}
		w := int(now.Sub(start) / blipWindow)
		path := "/fleet/" + user + "/w" + strconv.Itoa(w) + "/" + strconv.Itoa(sent)
		switch r := f.proxies[sent%3].do(t, "GET", path, "X-User-Id", user); r.status {
		case http.StatusOK, http.StatusTooManyRequests:
		default:
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		sent++
	}
	for _, i := range cut {
		f.switches[i].cut.Store(false)
	}
	return f.admittedPerWindow(t, user, windows, sent)
}

// admittedPerWindow waits until the access logs hold the sent decisions of
// user and counts the admitted ones per window (from their paths).
func (f *blipFleet) admittedPerWindow(t *testing.T, user string, windows, sent int) []int {
	t.Helper()
	var admitted []int
	prefix := "/fleet/" + user + "/w"
	ok := proctest.WaitFor(10*time.Second, func() bool {
		admitted = make([]int, windows)
		n := 0
		for _, p := range f.proxies {
			for _, line := range envoyproc.ReadJSONLines(t, p.accessLog) {
				path, _ := line["path"].(string)
				rest, found := strings.CutPrefix(path, prefix)
				if !found {
					continue
				}
				if rl, err := filterstate.FromLogLine(line); err != nil || rl["rule"] != "blip" {
					continue
				}
				n++
				w, _ := strconv.Atoi(rest[:strings.IndexByte(rest, '/')])
				if line["status_code"] == 200.0 && w < windows {
					admitted[w]++
				}
			}
		}
		return n >= sent
	})
	if !ok {
		t.Fatalf("the access logs hold fewer decisions of %s than the %d requests sent", user, sent)
	}
	return admitted
}

// TestABlipWithDemandAboveTheLimitCostsAtMostWhatTheWindowHadLeft: three real
// Envoys, two control planes, one Redis, a fixed window of L = 300 in 12 s
// with demand 3.2 L evenly spread. One Envoy cut off the quota service for
// 3 s mid-window, then one late in the window, then every Envoy mid-window:
// a cut-off Envoy admits by itself at most its share of what the window had
// left at its last answer, not a third of L, so counted from the access logs
// the window of the blip admits L within 5 %, and the windows after it
// exactly L. (A third of L each took the window to 363-392 with one Envoy
// cut off, 512-588 with all.)
func TestABlipWithDemandAboveTheLimitCostsAtMostWhatTheWindowHadLeft(t *testing.T) {
	f := startBlipFleet(t)
	for _, c := range []struct {
		name  string
		cut   []int
		cutAt time.Duration
	}{
		{"one Envoy mid-window", []int{0}, 4 * time.Second},
		{"one Envoy late in the window", []int{1}, 8 * time.Second},
		{"every Envoy mid-window", []int{0, 1, 2}, 4 * time.Second},
	} {
		user := strings.ReplaceAll(c.name, " ", "-")
		admitted := f.run(t, user, 4, c.cut, c.cutAt)
		t.Logf("%s: admitted per window %v (the first warms up, the blip is in the second), L = %d", c.name, admitted, blipLimit)
		if b := admitted[1]; b > blipLimit*105/100 || b < blipLimit*95/100 {
			t.Errorf("%s: the window of the blip admitted %d, want L = %d within 5 %%", c.name, b, blipLimit)
		}
		for w := 2; w < len(admitted); w++ {
			if admitted[w] != blipLimit {
				t.Errorf("%s: window %d after the blip admitted %d, want exactly L = %d", c.name, w-1, admitted[w], blipLimit)
			}
		}
	}
}
