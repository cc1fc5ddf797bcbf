package rlqs

import (
	"context"
	"strconv"
	"testing"
	"time"

	sq "github.com/sluice-proxy/sluice/shared/quota"
)

// leaseClient is a Wasm filter's quota client, reduced to one key: it spends
// from its lease, reports what it used every second and asks for its rate times
// 5/4 of that (as filter/internal/fleetclient sizes it).
type leaseClient struct {
	name       string
	held, used uint64
	exp        int64 // Unix ns
}

func (l *leaseClient) decide(now int64) bool {
	if l.held == 0 || now >= l.exp {
		return false
	}
	l.held--
	l.used++
	return true
}

func (l *leaseClient) tick(t *testing.T, s *sim, key string, rate float64) {
	fr, _ := s.q.Resolve("p", simEnv, "fw")
	want := uint64(rate*1.25) + 1
	res, err := s.q.Handle(context.Background(), &sq.Request{Envoy: l.name, Policy: "p", Version: fr.Version, Env: simEnv,
		Interval: time.Second, Keys: []sq.KeyRequest{{Rule: "fw", Key: key, Used: l.used, Want: want}}})
	if err != nil {
		t.Fatal(err)
	}
	l.used = 0
	k := res.Keys[0]
	if k.Held > 0 {
		l.held, l.exp = k.Held, s.unix()+int64(k.ExpiresIn)
	} else {
		l.held = 0
	}
}

// TestRLQSAndLeaseClientsShareOneKeyByDemand: three Envoys of Envoy's quota filter
// (reporting every 5 s) and two Wasm filters' lease clients (every second), each
// offered the same 100 requests a second against 300 per 10 s, get each their
// demand's share of every full window within ±20 %: the RLQS side three fifths.
func TestRLQSAndLeaseClientsShareOneKeyByDemand(t *testing.T) {
	s := newSimEvery(t, 3, 20*time.Millisecond, "fw", 5*time.Second)
	fr, _ := s.q.Resolve("p", simEnv, "fw")
	req := mustRequest(t, userHot)
	key, _ := fr.Key(req)
	leases := []*leaseClient{{name: "wasm-a"}, {name: "wasm-b"}}
	var rlqsAt, wasmAt []int64
	const step = 10 * time.Millisecond
	nextTick := s.clk.Now()
	for end := s.clk.Now() + 60*time.Second; s.clk.Now() < end; {
		s.clk.Advance(step)
		now := s.unix()
		for i, c := range s.envoys {
			// Envoy i starts at its own phase of the report interval.
			if s.clk.Now() >= simUptime+time.Duration(i)*1700*time.Millisecond && c.Decide(userHot) {
				rlqsAt = append(rlqsAt, now)
			}
		}
		if s.clk.Now() >= nextTick {
			nextTick += time.Second
			for _, l := range leases {
				l.tick(t, s, key, 100)
			}
		}
		for _, l := range leases {
			if l.decide(now) {
				wasmAt = append(wasmAt, now)
			}
		}
	}
	until := s.unix()
	count := func(at []int64, from int64) int {
		n := 0
		for _, x := range at {
			if x >= from && x < from+int64(10*time.Second) {
				n++
			}
		}
		return n
	}
	var line []string
	for w := s.base + int64(10*time.Second); w+int64(10*time.Second) <= until; w += int64(10 * time.Second) {
		r, l := count(rlqsAt, w), count(wasmAt, w)
		total := r + l
		line = append(line, strconv.Itoa(r)+"+"+strconv.Itoa(l))
		if total > 300 {
			t.Errorf("window at +%ds admitted %d > 300", (w-s.base)/1e9, total)
		}
		if want := total * 3 / 5; r < want*8/10 || r > want*12/10 {
			t.Errorf("window at +%ds: the RLQS Envoys admitted %d of %d, want their demand's share %d ± 20 %%", (w-s.base)/1e9, r, total, want)
		}
	}
	t.Logf("admitted per full window, RLQS + leases: %v (limit 300)", line)
}
