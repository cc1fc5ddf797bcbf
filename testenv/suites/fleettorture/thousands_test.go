package fleettorture

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// The fleet of thousands: simulated Envoys that keep the filter's lease as the
// quota protocol defines it (shared/quota: admit from the units held until the
// lease ends, measured from when the call was sent; report what was admitted once
// a second; a lease the answer says the service holds nothing else of replaces
// the old), all on one key of one fleet rule, through two control-plane processes
// on one redis-server. A request is admitted only from a lease, so what the fleet
// admits in a window is what the service granted in it, at most.
const (
	bigFleet  = 2000
	bigWindow = 5 * time.Second
	bigLimit  = 10000 // per window
	// bigOffered is the fleet's requests per window: twice the limit, spread
	// evenly over the Envoys and the window.
	bigOffered = 2 * bigLimit
)

var bigPolicy = `{"policy":"default","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"search","match":{"path_prefix":"/search"},"algorithm":"fixed_window","limit":` + strconv.Itoa(bigLimit) +
	`,"window":"5s","scope":"fleet","on_quota_failure":"deny"}]}`

// leaseEnvoy is one simulated Envoy's lease of the key.
type leaseEnvoy struct {
	mu        sync.Mutex
	held      uint64
	exp       time.Time
	used      uint64 // admitted since the last report
	replica   int    // the replica it calls; it fails over to the other on an error
	admitted  map[int64]int
	denied    map[int64]int
	callFails int
}

// admit decides one request at now from the lease.
func (e *leaseEnvoy) admit(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := now.UnixNano() / int64(bigWindow)
	if e.held > 0 && now.Before(e.exp) {
		e.held--
		e.used++
		e.admitted[w]++
		return
	}
	e.denied[w]++
}

// TestThousandsOfEnvoysOnOneKeyKeepTheLimit: 2,000 Envoys share one key of 10,000
// per 5 s window, offered twice that; a control-plane replica is killed for two
// windows and restarted, then Redis is killed and restarted empty. No window
// admits more than the limit (twice it in the window whose counter Redis lost),
// and every window away from a fault admits most of it.
func TestThousandsOfEnvoysOnOneKeyKeepTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about a minute")
	}
	rs := redisproc.Start(t)
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	var cps []*proctest.Proc
	var addrs []string
	for i := 0; i < 2; i++ {
		addr := proctest.FreeAddr(t)
		p := proctest.Start(t, proctest.Spec{Name: "control plane " + strconv.Itoa(i), Bin: filepath.Join(binDir, "sluice-controlplane"),
			Args: []string{"--listen", addr, "--log-level", "warn", "--resync-interval", "200ms", "--redis-url", rs.URL()}, Env: tokens})
		proctest.AwaitHTTP(t, "http://"+addr+"/readyz", 20*time.Second, p)
		cps, addrs = append(cps, p), append(addrs, addr)
	}
	version := proctest.PutPolicy(t, addrs[0], "default", adminToken, bigPolicy)
	key := proctest.UnkeyedCounterKey(t, bigPolicy, "dev", 0)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 2048}}

	envoys := make([]*leaseEnvoy, bigFleet)
	for i := range envoys {
		envoys[i] = &leaseEnvoy{replica: i % 2, admitted: map[int64]int{}, denied: map[int64]int{}}
	}
	// report makes Envoy i's quota call: what it admitted since the last, and
	// twice that (or 2 units) more.
	report := func(ctx context.Context, i int) {
		e := envoys[i]
		e.mu.Lock()
		used, replica := e.used, e.replica
		e.used = 0
		e.mu.Unlock()
		want := max(2, 2*used)
		body := quota.AppendRequest(nil, &quota.Request{Envoy: "envoy-" + strconv.Itoa(i), Policy: "default", Version: version,
			Env: "dev", Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "search", Key: key, Used: used, Want: want}}})
		sent := time.Now()
		r, err := bigCall(ctx, hc, addrs[replica], body)
		e.mu.Lock()
		defer e.mu.Unlock()
		if err != nil {
			e.callFails++
			e.used += used // reported again next time
			e.replica = 1 - replica
			return
		}
		if r.Held == r.Granted {
			e.held = r.Granted // the service holds nothing else: the old lease is replaced
		} else {
			e.held += r.Granted
		}
		e.held = min(e.held, r.Held)
		if r.Held > 0 {
			e.exp = sent.Add(r.ExpiresIn)
		}
	}
	// Every Envoy joins, then reports once a second at its own offset and
	// receives requests at its share of the offered rate.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	every := time.Duration(int64(bigWindow) * bigFleet / bigOffered)
	for i := range envoys {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			off := time.Duration(i) * time.Second / bigFleet
			nextReport := start.Add(off)
			nextReq := start.Add(time.Duration(i) * every / bigFleet)
			tick := time.NewTimer(0)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				// Requests that came while the Envoy waited for its last answer are
				// decided now, as a proxy decides what it has queued: with the lease
				// it holds now, in the window it is now.
				now := time.Now()
				for !nextReq.After(now) {
					envoys[i].admit(now)
					nextReq = nextReq.Add(every)
				}
				if !nextReport.After(now) {
					report(ctx, i)
					nextReport = nextReport.Add(time.Second)
				}
				tick.Reset(time.Until(minTime(nextReq, nextReport)))
			}
		}(i)
	}
	// Faults, each after a clean window: a replica down for two windows; Redis
	// killed and restarted empty.
	windowStart := func(k int64) time.Time { return time.Unix(0, k*int64(bigWindow)) }
	// Two whole windows warm up (leases sized from the Envoys' reports), not judged.
	first := time.Now().UnixNano()/int64(bigWindow) + 3
	time.Sleep(time.Until(windowStart(first + 1))) // a clean window first: the schedule, not an event
	replicaDown := time.Now().UnixNano() / int64(bigWindow)
	cps[1].Kill()
	time.Sleep(2 * bigWindow) // the fault's length
	cps[1].Start()
	proctest.AwaitHTTP(t, "http://"+addrs[1]+"/readyz", 20*time.Second, cps[1])
	replicaUp := time.Now().UnixNano() / int64(bigWindow)
	time.Sleep(time.Until(windowStart(replicaUp + 2)))
	redisLost := time.Now().UnixNano() / int64(bigWindow)
	rs.Restart()
	last := redisLost + 2
	time.Sleep(time.Until(windowStart(last + 1)))
	cancel()
	wg.Wait()

	var b strings.Builder
	b.WriteString("\nwindow  admitted  denied  limit  verdict\n")
	calls := 0
	for _, e := range envoys {
		calls += e.callFails
	}
	for w := first; w <= last; w++ {
		admitted, denied := 0, 0
		for _, e := range envoys {
			admitted += e.admitted[w]
			denied += e.denied[w]
		}
		bound := bigLimit
		if w == redisLost {
			bound = 2 * bigLimit // the counter restarted from zero in this window
		}
		fault := w >= replicaDown && w <= replicaUp || w >= redisLost && w <= redisLost+1
		var bad []string
		if admitted > bound {
			bad = append(bad, "over-admitted")
		}
		// Away from faults, where demand stayed above the limit (at least half
		// of it again denied), at least 80 % of the limit: the rest is what 2,000
		// Envoys leave unspent in leases their next requests come too late for.
		// Without the race detector every such window admitted the limit exactly.
		// Under it the simulated fleet itself runs late (its first judged window
		// admitted 59 to 91 %), so there only the limit is judged.
		if !raceDetector && !fault && admitted < bigLimit*8/10 && denied >= bigLimit/2 {
			bad = append(bad, "under-admitted")
		}
		verdict := "ok"
		if len(bad) > 0 {
			verdict = strings.Join(bad, ", ")
			t.Errorf("window %d: %d admitted, %d denied: %s (limit %d, bound %d)", w-first, admitted, denied, verdict, bigLimit, bound)
		}
		kind := "      "
		switch {
		case w >= replicaDown && w <= replicaUp:
			kind = "replica"
		case w >= redisLost && w <= redisLost+1:
			kind = "redis "
		}
		b.WriteString(kind + " " + strconv.FormatInt(w-first, 10) + "  " + strconv.Itoa(admitted) + "  " + strconv.Itoa(denied) + "  " + strconv.Itoa(bound) + "  " + verdict + "\n")
	}
	b.WriteString("quota calls that failed (a replica or Redis down): " + strconv.Itoa(calls) + "\n")
	t.Log(b.String())
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// bigCall posts one quota request to the replica at addr and returns its one key's
// answer; an HTTP error or a non-200 answer is an error.
func bigCall(ctx context.Context, hc *http.Client, addr string, body []byte) (quota.KeyResult, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/quota", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+quotaToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return quota.KeyResult{}, err
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return quota.KeyResult{}, &statusError{resp.StatusCode}
	}
	r, err := quota.DecodeResponse(data)
	if err != nil {
		return quota.KeyResult{}, err
	}
	if len(r.Keys) != 1 {
		return quota.KeyResult{}, io.ErrUnexpectedEOF
	}
	return r.Keys[0], nil
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "HTTP " + strconv.Itoa(e.code) }
