package rlqsfleet

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
)

const (
	limit  = 300
	window = 10 * time.Second
)

// hotPolicy: one fleet rule, 300 per 10 s per user, denying when the quota service
// cannot answer, so that a fault can only under-admit.
var hotPolicy = `{"policy":"` + policyName + `","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"hot","match":{"path_prefix":"/hot"},"key":["user"],"algorithm":"fixed_window","limit":` + strconv.Itoa(limit) +
	`,"window":"10s","scope":"fleet","on_quota_failure":"deny"}]}`

// admissions records when requests were admitted, per source: at, when the
// answer was back (Unix ns), and began, when the decision was asked for. A
// decision was made between the two; a goroutine descheduled under load only
// moves at later, so "admitted after t" is judged by began.
type admissions struct {
	mu        sync.Mutex
	at, began map[string][]int64
}

func (a *admissions) add(src string, began int64) {
	now := time.Now().UnixNano()
	a.mu.Lock()
	a.at[src] = append(a.at[src], now)
	a.began[src] = append(a.began[src], began)
	a.mu.Unlock()
}

// perWindow returns, for each whole fixed window (aligned to the Unix epoch, as the
// server's are) between from and to, the admissions of each source.
func (a *admissions) perWindow(from, to int64) (starts []int64, counts []map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := int64(window)
	for s := (from/w + 1) * w; s+w <= to; s += w {
		c := map[string]int{}
		for src, ats := range a.at {
			for _, at := range ats {
				if at >= s && at < s+w {
					c[src]++
				}
			}
		}
		starts, counts = append(starts, s), append(counts, c)
	}
	return starts, counts
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// mixedFleet is two Wasm Envoys (wasm-a on control plane a, wasm-b on b) and three
// Envoys of the rate_limit_quota kind (rlqs-a1 and rlqs-a2 on a, rlqs-b on b), each
// sending a request for the hot user every 30 ms until stop, counted in adm.
type mixedFleet struct {
	wasm map[string]*host.Host
	rlqs map[string]*rlqsclient.Client
	adm  *admissions
	ctx  context.Context
	stop func() // ends the traffic and waits for it
}

func startMixedFleet(t *testing.T, a, b *controlPlane, v uint64) *mixedFleet {
	settings := bucketSettings(t, a, "hot", 250*time.Millisecond)
	f := &mixedFleet{wasm: map[string]*host.Host{"wasm-a": wasmEnvoy(t, a.addr, v), "wasm-b": wasmEnvoy(t, b.addr, v)},
		rlqs: map[string]*rlqsclient.Client{"rlqs-a1": rlqsEnvoy(t, a.grpcAddr, settings), "rlqs-b": rlqsEnvoy(t, b.grpcAddr, settings),
			"rlqs-a2": rlqsEnvoy(t, a.grpcAddr, settings)},
		adm: &admissions{at: map[string][]int64{}, began: map[string][]int64{}}}
	id := map[string]string{"policy": policyName, "rule": "hot", "user": "hot"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.ctx, f.stop = ctx, func() { cancel(); wg.Wait() }
	pace := func(src string, try func() bool) {
		defer wg.Done()
		tk := time.NewTicker(30 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				began := time.Now().UnixNano()
				if try() {
					f.adm.add(src, began)
				}
			}
		}
	}
	for src, h := range f.wasm {
		wg.Add(1)
		go pace(src, func() bool {
			r, err := h.Worker(0).Do(ctx, host.Request{Path: "/hot", Headers: host.Headers{{"x-user-id", "hot"}}})
			return err == nil && r.Status == 200
		})
	}
	for src, c := range f.rlqs {
		wg.Add(1)
		go pace(src, func() bool { return c.Decide(id) })
	}
	return f
}

// TestWasmAndRLQSEnvoysShareOneBudget: two Wasm Envoys and three Envoys of the
// rate_limit_quota kind, spread over two control planes on one Redis, all hammer one
// user's key (about 170 requests/s against 30/s) for 40 s. No window admits more than the limit:
// not when an RLQS Envoy's stream drops, not while a control plane is killed, not
// after it restarts. The RLQS Envoys report every 5 s, as Envoy's filter does; those
// of the killed replica fall back as configured (deny) once their assignments end
// (a busy bucket's lasts the report interval and a second: 6 s) and resume once it
// is back.
func TestWasmAndRLQSEnvoysShareOneBudget(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{AppendOnly: true})
	a, b := startControlPlane(t, redis.URL()), startControlPlane(t, redis.URL())
	v := proctest.PutPolicy(t, a.addr, policyName, adminToken, hotPolicy)
	f := startMixedFleet(t, a, b, v)
	rlqs, adm, ctx := f.rlqs, f.adm, f.ctx
	start := time.Now()
	at := func(d time.Duration) {
		if w := time.Until(start.Add(d)); w > 0 {
			select {
			case <-time.After(w): // the fault schedule: traffic runs meanwhile
			case <-ctx.Done():
			}
		}
	}
	at(8 * time.Second)
	rlqs["rlqs-a1"].Disconnect()
	at(12 * time.Second)
	a.p.Kill()
	killed := time.Now().UnixNano()
	at(24 * time.Second)
	a.p.Start()
	a.await(t)
	restarted := time.Now().UnixNano()
	at(40 * time.Second)
	f.stop()
	end := time.Now().UnixNano()

	starts, counts := adm.perWindow(start.UnixNano(), end)
	if len(starts) < 3 {
		t.Fatalf("only %d whole windows", len(starts))
	}
	for i, c := range counts {
		total := sum(c)
		t.Logf("window %s: %d admitted (limit %d): %v", time.Unix(0, starts[i]).Format("15:04:05"), total, limit, sortedCounts(c))
		if total > limit {
			t.Errorf("window at %s admitted %d > %d", time.Unix(0, starts[i]).Format("15:04:05"), total, limit)
		}
		if starts[i] > restarted+int64(2*time.Second) && total < limit*8/10 {
			t.Errorf("window at %s after the restart admitted only %d of %d", time.Unix(0, starts[i]).Format("15:04:05"), total, limit)
		}
	}
	// The RLQS Envoys of the killed replica lost their stream, and came back.
	for _, src := range []string{"rlqs-a1", "rlqs-a2"} {
		s := rlqs[src].Stats()
		if s.ReportsDropped == 0 {
			t.Errorf("%s dropped no report while its control plane was down: %+v", src, s)
		}
		resumed := 0
		adm.mu.Lock()
		for _, x := range adm.at[src] {
			if x > restarted {
				resumed++
			}
		}
		adm.mu.Unlock()
		t.Logf("%s: %d admitted after the restart; stats %+v", src, resumed, s)
	}
	after := 0
	adm.mu.Lock()
	for _, src := range []string{"rlqs-a1", "rlqs-a2"} {
		for _, x := range adm.at[src] {
			if x > restarted {
				after++
			}
		}
	}
	during := 0
	for _, src := range []string{"rlqs-a1", "rlqs-a2"} {
		for _, x := range adm.began[src] {
			if x > killed+int64(7*time.Second) && x < restarted {
				during++
			}
		}
	}
	adm.mu.Unlock()
	if after == 0 {
		t.Error("the RLQS Envoys of the restarted control plane admitted nothing after it came back")
	}
	if during != 0 {
		t.Errorf("the RLQS Envoys of the killed control plane admitted %d requests more than 7 s into its outage: their assignments last at most 6 s, then they deny as their rule says", during)
	}
}

func sortedCounts(m map[string]int) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+strconv.Itoa(v))
	}
	sort.Strings(out)
	return out
}
