package rlqs

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/spans"
)

// policies is a fixed set of policy records.
type policies struct {
	mu sync.Mutex
	m  map[string]store.Record
}

func (p *policies) Get(name string) (store.Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[name]
	return r, ok
}

func (p *policies) set(t testing.TB, doc string) *rules.Policy {
	t.Helper()
	pol, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]store.Record{}
	}
	pol.Version = p.m[pol.Name].Version + 1
	p.m[pol.Name] = store.Record{Name: pol.Name, Version: pol.Version, Doc: rules.EncodePolicy(pol)}
	return pol
}

const simEnv = "sim"

// simPolicy: a fixed window of 300 per 10 s and a token bucket of 100 a second with
// a burst of 1000, both per user; and rules the RLQS server must abandon.
const simPolicy = `{"policy":"p","identity":{"user_header":"x-user-id"},"exempt":{"users":["vip"]},"rules":[
 {"id":"fw","match":{"path_prefix":"/fw"},"key":["user"],"algorithm":"fixed_window","limit":300,"window":"10s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"tb","match":{"path_prefix":"/tb"},"key":["user"],"algorithm":"token_bucket","limit":100,"burst":1000,"window":"1s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"pass","match":{"path_prefix":"/pass"},"key":["user"],"algorithm":"fixed_window","limit":300,"window":"10s","scope":"fleet","on_quota_failure":"pass"},
 {"id":"local","algorithm":"fixed_window","limit":10,"window":"10s"},
 {"id":"short","match":{"path_prefix":"/short"},"algorithm":"token_bucket","limit":1000,"burst":100,"window":"1s","scope":"fleet"},
 {"id":"costly","match":{"path_prefix":"/costly"},"algorithm":"fixed_window","limit":100,"window":"10s","cost":5,"scope":"fleet"},
 {"id":"ip","match":{"path_prefix":"/ip"},"key":["client_ip"],"algorithm":"fixed_window","limit":300,"window":"10s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w2","match":{"path_prefix":"/w2"},"key":["user"],"algorithm":"fixed_window","limit":100,"window":"2s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w5","match":{"path_prefix":"/w5"},"key":["user"],"algorithm":"fixed_window","limit":100,"window":"5s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w5half","match":{"path_prefix":"/w5half"},"key":["user"],"algorithm":"fixed_window","limit":50,"window":"5s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w10","match":{"path_prefix":"/w10"},"key":["user"],"algorithm":"fixed_window","limit":100,"window":"10s","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w60","match":{"path_prefix":"/w60"},"key":["user"],"algorithm":"fixed_window","limit":100,"window":"1m","scope":"fleet","on_quota_failure":"deny"},
 {"id":"w10local","match":{"path_prefix":"/w10local"},"key":["user"],"algorithm":"fixed_window","limit":100,"window":"10s","scope":"fleet"},
 {"id":"tb10","match":{"path_prefix":"/tb10"},"key":["user"],"algorithm":"token_bucket","limit":10,"burst":50,"window":"1s","scope":"fleet","on_quota_failure":"deny"}]}`

// sim is Envoys running Envoy's rate_limit_quota filter (rlqsclient) against one
// RLQS server, on a fake clock: reports and responses each take delay to arrive.
type sim struct {
	t      *testing.T
	clk    *rlqsclient.FakeClock
	base   int64 // Unix ns at clock start, a multiple of a minute
	pol    *policies
	q      *quota.Service
	srv    *Server
	reg    *prometheus.Registry
	envoys []*rlqsclient.Client
	// admitted holds the Unix ns of every allowed request.
	admitted []int64
	// by holds, where recorded (runOffered), the Envoy of each admitted request.
	by []int
}

const simUptime = time.Hour

func (s *sim) unix() int64 { return s.base + int64(s.clk.Now()-simUptime) }

func newSim(t *testing.T, n int, delay time.Duration, rule string) *sim {
	return newSimEvery(t, n, delay, rule, time.Second)
}

// newSimEvery is newSim with the Envoys reporting every reportEvery (Envoy
// itself: rlqsclient.EnvoyReportInterval).
func newSimEvery(t *testing.T, n int, delay time.Duration, rule string, reportEvery time.Duration) *sim {
	s := &sim{t: t, clk: rlqsclient.NewFakeClock(simUptime), pol: &policies{}, reg: prometheus.NewRegistry()}
	m := int64(time.Minute)
	s.base = time.Now().UnixNano()/m*m + m
	p := s.pol.set(t, simPolicy)
	s.q = quota.New(quota.Options{Backend: quota.NewMemory(), Policies: s.pol, Open: true, Now: s.unix, Timeout: time.Minute})
	s.srv = New(Options{Quota: s.q, Now: s.unix, Registry: s.reg, Margin: DefaultMargin})
	var r *rules.Rule
	for i := range p.Rules {
		if p.Rules[i].ID == rule {
			r = &p.Rules[i]
		}
	}
	settings, err := Settings(p, r, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		ss := s.srv.newStream("")
		var c *rlqsclient.Client
		var scheduled int64 // when the stream's next follow-up is scheduled, 0 if none
		// answer runs one of the server's rounds and delivers its response, then
		// schedules the stream's next follow-up, as the stream's goroutine does.
		var answer func(round func() (*rlqsv3.RateLimitQuotaResponse, []func(int64)))
		answer = func(round func() (*rlqsv3.RateLimitQuotaResponse, []func(int64))) {
			resp, after := round()
			if err := resp.ValidateAll(); len(resp.BucketAction) > 0 && err != nil {
				t.Errorf("invalid response: %v", err) // an empty one is never sent
			}
			at := s.unix()
			for _, f := range after {
				f(at)
			}
			if len(resp.BucketAction) > 0 {
				s.clk.AfterFunc(delay, func() { c.Apply(resp) })
			}
			if due := ss.nextFollowUp(); due > 0 && (scheduled == 0 || due < scheduled) {
				scheduled = due
				s.clk.AfterFunc(time.Duration(max(due-s.unix(), 0)), func() {
					if scheduled == due {
						scheduled = 0
					}
					answer(func() (*rlqsv3.RateLimitQuotaResponse, []func(int64)) { return ss.followUps(context.Background()) })
				})
			}
		}
		c = rlqsclient.New(nil, s.clk, rlqsclient.Config{Domain: simEnv, Settings: settings, ReportEvery: reportEvery,
			Loopback: func(r *rlqsv3.RateLimitQuotaUsageReports) {
				s.clk.AfterFunc(delay, func() {
					answer(func() (*rlqsv3.RateLimitQuotaResponse, []func(int64)) { return ss.handle(context.Background(), r) })
				})
			}})
		s.envoys = append(s.envoys, c)
	}
	t.Cleanup(func() {
		for _, c := range s.envoys {
			c.Close()
		}
	})
	return s
}

// run sends every Envoy perStep requests of bucket id every step for d.
func (s *sim) run(d, step time.Duration, perStep int, id map[string]string) {
	for end := s.clk.Now() + d; s.clk.Now() < end; {
		s.clk.Advance(step)
		for _, c := range s.envoys {
			for range perStep {
				if c.Decide(id) {
					s.admitted = append(s.admitted, s.unix())
				}
			}
		}
	}
}

// perWindow returns the admitted count of each whole window of w from the start.
func (s *sim) perWindow(w time.Duration, until int64) []int {
	var out []int
	for start := s.base; start+int64(w) <= until; start += int64(w) {
		n := 0
		for _, at := range s.admitted {
			if at >= start && at < start+int64(w) {
				n++
			}
		}
		out = append(out, n)
	}
	return out
}

// fewestPerWindow returns, for each whole window of w from the start, the
// fewest requests one Envoy had admitted in it (by runOffered's record).
func (s *sim) fewestPerWindow(w time.Duration, until int64) []int {
	var out []int
	for start := s.base; start+int64(w) <= until; start += int64(w) {
		per := make([]int, len(s.envoys))
		for k, at := range s.admitted {
			if at >= start && at < start+int64(w) {
				per[s.by[k]]++
			}
		}
		out = append(out, slices.Min(per))
	}
	return out
}

var userHot = map[string]string{"policy": "p", "rule": "fw", "user": "hot"}

// TestFixedWindowFleetNeverAdmitsMoreThanTheLimit: N Envoys, each wanting far more
// than the limit, against one fixed-window key: no window admits more than L, and
// most of L is admitted.
func TestFixedWindowFleetNeverAdmitsMoreThanTheLimit(t *testing.T) {
	for _, n := range []int{3, 32} {
		for _, delay := range []time.Duration{0, 100 * time.Millisecond} {
			// Every Envoy sends one request per step: 100/s each (hot), or together
			// just over the limit's 30/s (so grants are still live at a window's end).
			for _, step := range []time.Duration{10 * time.Millisecond, time.Duration(n) * 80 * time.Millisecond / 3} {
				s := newSim(t, n, delay, "fw")
				s.run(60*time.Second, step, 1, userHot)
				ws := s.perWindow(10*time.Second, s.unix())
				for i, got := range ws {
					if got > 300 {
						t.Errorf("N=%d delay %v step %v: window %d admitted %d > 300", n, delay, step, i, got)
					}
				}
				// The first window starts cold; the others must come close to L.
				for i, got := range ws[1:] {
					if got < 240 {
						t.Errorf("N=%d delay %v step %v: window %d admitted only %d of 300", n, delay, step, i+1, got)
					}
				}
				t.Logf("N=%d one-way delay %v, demand %.1f/s: admitted per 10 s window %v (limit 300)", n, delay,
					float64(n)*float64(time.Second)/float64(step), ws)
			}
		}
	}
}

// TestTokenBucketFleetNeverAdmitsMoreThanItsBound: over any interval t the fleet
// admits at most burst + rate·t.
func TestTokenBucketFleetNeverAdmitsMoreThanItsBound(t *testing.T) {
	id := map[string]string{"policy": "p", "rule": "tb", "user": "hot"}
	for _, n := range []int{3, 32} {
		s := newSim(t, n, 50*time.Millisecond, "tb")
		s.run(30*time.Second, 10*time.Millisecond, 1, id)
		for _, d := range []time.Duration{100 * time.Millisecond, time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second} {
			bound := 1000 + int(100*d/time.Second)
			if got := spans.MostWithin(s.admitted, d); got > bound {
				t.Errorf("N=%d: %d admitted within %v > %d", n, got, d, bound)
			}
		}
		total := len(s.admitted)
		t.Logf("N=%d: %d admitted in 30 s (bound 1000 + 100/s·30 s = 4000; most in 10 s: %d of ≤ 2000)", n, total, spans.MostWithin(s.admitted, 10*time.Second))
		if total < 2500 {
			t.Errorf("N=%d: only %d admitted in 30 s of unbounded demand", n, total)
		}
	}
}

// TestFailOpenAdmissionsAreCharged: with on_quota_failure "pass" a new bucket's
// first request is admitted before any assignment; the server charges it, so the
// window still admits at most L plus those first requests, and later windows L.
func TestFailOpenAdmissionsAreCharged(t *testing.T) {
	const n = 8
	id := map[string]string{"policy": "p", "rule": "pass", "user": "hot"}
	s := newSim(t, n, 50*time.Millisecond, "pass")
	s.run(30*time.Second, 10*time.Millisecond, 1, id)
	ws := s.perWindow(10*time.Second, s.unix())
	// Within the first round trip (two delays) an Envoy admits its first requests
	// without an assignment: 10 steps of 10 ms.
	if ws[0] > 300+n*10 {
		t.Errorf("first window admitted %d > 300 + %d first requests", ws[0], n*10)
	}
	for i, got := range ws[1:] {
		if got > 300 {
			t.Errorf("window %d admitted %d > 300", i+1, got)
		}
	}
	charged := counterWith(t, s.reg, "sluice_controlplane_rlqs_units_charged_total", "", "")
	if charged < n {
		t.Errorf("charged %v units; each of %d Envoys admitted at least one request before its first assignment", charged, n)
	}
	t.Logf("admitted per window %v; units charged %v", ws, charged)
}
