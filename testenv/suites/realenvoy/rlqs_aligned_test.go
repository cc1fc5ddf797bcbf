package realenvoy

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// rlqsAlignedLimit is L of rlqsAlignedPolicy's 5 s rule: four Envoys' fair
// shares are 12 units, so a unit lost per assignment is 8 % of L.
const rlqsAlignedLimit = 50

var rlqsAlignedPolicy = `{"policy":"fleet","identity":{"tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"per-tenant-5s","match":{"path_prefix":"/w5/"},"key":["tenant"],"algorithm":"fixed_window",` +
	`"limit":` + strconv.Itoa(rlqsAlignedLimit) + `,"window":"5s","scope":"fleet"}]}`

// TestEnvoysOwnRateLimitQuotaFilterWithAlignedReportsAdmitsNearlyTheLimit: four
// real Envoys running Envoy's own rate_limit_quota filter (configured by
// `sluicectl envoy-config rlqs`), whose reports fall at one moment, as when a
// Deployment's pods start together: at a window's edge, and halfway through
// it. Offered 2 L per 5 s window on a rule of L = 50 for 50 s, counted from
// what the clients got: never more than L in a window, and past the first
// windows (10 s at the edge; 25 s halfway, whose first windows got 40 while
// the buckets' report intervals were learned) at least 90 % of L in every
// window, with no Envoy admitting nothing in two windows in a row. (Before:
// 44 of 50 in every window at the edge, each assignment reserving a token of
// refill it could never reach; 40 halfway, never followed up at the window's
// turn.)
func TestEnvoysOwnRateLimitQuotaFilterWithAlignedReportsAdmitsNearlyTheLimit(t *testing.T) {
	for _, c := range []struct {
		name        string
		phase, warm time.Duration
	}{
		{"at the window's edge", 0, 10 * time.Second},
		{"halfway through the window", 2500 * time.Millisecond, 25 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			envoys := startRLQSEnvoys(t, "rlqs-aligned-", rlqsAlignedPolicy)
			// Envoy reports every 5 s from its first request: every Envoy gets
			// its first at one moment, the phase into a 5 s window.
			start := time.Now().Truncate(rlqsWindow).Add(2 * rlqsWindow)
			time.Sleep(time.Until(start.Add(-rlqsWindow + c.phase)))
			for _, e := range envoys {
				req, _ := http.NewRequest("GET", "http://"+e.Listener+"/w5/warm", nil)
				req.Header.Set("X-Tenant-Id", "warm")
				resp, err := fresh.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", e.Name, err)
				}
				resp.Body.Close()
			}
			const w = 5 * time.Second
			end := start.Add(10 * w)
			load := offerRLQS(t, envoys, "/w5/items", w, 2*rlqsAlignedLimit, start, end)
			load.wait()
			starved := make([]int, len(envoys))
			for at := start; at.Before(end); at = at.Add(w) {
				warm := !at.Before(start.Add(c.warm))
				n := load.admitted[at.Unix()]
				t.Logf("window %s: %d admitted of %d offered, by Envoy %v (L = %d)", at.Format("15:04:05"), n, 2*rlqsAlignedLimit, load.byEnvoy[at.Unix()], rlqsAlignedLimit)
				if n > rlqsAlignedLimit {
					t.Errorf("window %s: %d admitted, over L = %d", at.Format("15:04:05"), n, rlqsAlignedLimit)
				}
				if warm && n < rlqsAlignedLimit*90/100 {
					t.Errorf("window %s: %d admitted, less than 90 %% of L = %d", at.Format("15:04:05"), n, rlqsAlignedLimit)
				}
				for e := range envoys {
					if !warm || (load.byEnvoy[at.Unix()] != nil && load.byEnvoy[at.Unix()][e] > 0) {
						starved[e] = 0
						continue
					}
					if starved[e]++; starved[e] > 1 {
						t.Errorf("window %s: %s admitted nothing in %d windows in a row", at.Format("15:04:05"), envoys[e].Name, starved[e])
					}
				}
			}
		})
	}
}
