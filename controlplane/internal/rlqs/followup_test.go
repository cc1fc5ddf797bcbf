package rlqs

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
)

// TestATokenBucketIsFollowedUpBetweenReports: over loopback gRPC, an Envoy
// reporting at Envoy's own 5 s cadence on a token bucket (10 a second, burst
// 50) whose assignments live at most 2 s (its lease, V = 2.5 s) is not left
// on its expired behaviour (DENY_ALL) for the rest of the interval: the
// server pushes its next assignment before the last one dies, so every second
// between its second report and its third admits requests. (Offered twice the
// rate; the first report only starts the clock of the bucket's interval.)
func TestATokenBucketIsFollowedUpBetweenReports(t *testing.T) {
	pol := &policies{}
	p := pol.set(t, simPolicy)
	reg := prometheus.NewRegistry()
	q := quota.New(quota.Options{Backend: quota.NewMemory(), Policies: pol, Open: true, Timeout: time.Minute})
	srv := New(Options{Quota: q, Registry: reg})
	conn := serveLoopback(t, srv)
	var r *rules.Rule
	for i := range p.Rules {
		if p.Rules[i].ID == "tb10" {
			r = &p.Rules[i]
		}
	}
	settings, err := Settings(p, r, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := rlqsclient.New(conn, rlqsclient.NewRealClock(time.Hour), rlqsclient.Config{Domain: simEnv, Settings: settings})
	defer c.Close()
	id := map[string]string{"policy": "p", "rule": "tb10", "user": "hot"}

	const every = 50 * time.Millisecond // 20 a second
	var admitted []time.Duration
	start := time.Now()
	for i := 0; ; i++ {
		at := time.Duration(i) * every
		if at >= rlqsclient.EnvoyReportInterval*2 {
			break
		}
		time.Sleep(time.Until(start.Add(at)))
		if c.Decide(id) {
			admitted = append(admitted, time.Since(start))
		}
	}
	// Every whole second from the second report's answer (5 s) to the third
	// report (10 s) admitted some.
	for s := rlqsclient.EnvoyReportInterval + 500*time.Millisecond; s+time.Second <= 2*rlqsclient.EnvoyReportInterval-250*time.Millisecond; s += time.Second {
		n := 0
		for _, at := range admitted {
			if at >= s && at < s+time.Second {
				n++
			}
		}
		if n == 0 {
			t.Errorf("nothing admitted from %v to %v after the first request, between two reports: the assignment died and none followed", s, s+time.Second)
		}
	}
	if got := counterWith(t, reg, "sluice_controlplane_rlqs_follow_ups_total", "", ""); got == 0 {
		t.Errorf("sluice_controlplane_rlqs_follow_ups_total = 0")
	}
	t.Logf("%d admitted in %v, offered 20 a second (rate 10, burst 50)", len(admitted), 2*rlqsclient.EnvoyReportInterval)
}
