package rlqsfleet

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/spans"
)

// A token bucket of bucketRate a second with a capacity of bucketBurst.
const (
	bucketRate  = 10
	bucketBurst = 50
)

// bucketPolicy: one fleet token bucket per user, denying when the quota service
// cannot answer, so that a fault can only under-admit.
var bucketPolicy = `{"policy":"` + policyName + `","identity":{"user_header":"x-user-id"},"rules":[` +
	`{"id":"bucket","match":{"path_prefix":"/bucket"},"key":["user"],"algorithm":"token_bucket","limit":` + strconv.Itoa(bucketRate) +
	`,"burst":` + strconv.Itoa(bucketBurst) + `,"window":"1s","scope":"fleet","on_quota_failure":"deny"}]}`

// TestATokenBucketAcrossReplicasReachesItsRateAndNeverPassesItsBound: four
// Envoys of the rate_limit_quota kind, two on each of two control planes on one
// Redis, report every 5 s as Envoy's filter does, their first requests a quarter
// of that interval apart, and offer twice a token bucket's rate (10 a second,
// burst 50) on one key for a minute; one control plane is killed 25 s in and
// restarted 8 s later. Counted from what the Envoys were admitted: never more
// than the bucket's capacity plus its refill over any 1 s, 5 s or 30 s, fault
// or not; and at least 95 % of its rate from 10 s in until the kill, and again
// from 15 s after the restart (each Envoy's interval is known from its second
// report on; only then does the server follow its assignments up between
// reports, docs/rlqs.md "Between reports").
func TestATokenBucketAcrossReplicasReachesItsRateAndNeverPassesItsBound(t *testing.T) {
	redis := redisproc.Start(t, redisproc.Options{AppendOnly: true})
	a, b := startControlPlane(t, redis.URL()), startControlPlane(t, redis.URL())
	proctest.PutPolicy(t, a.addr, policyName, adminToken, bucketPolicy)
	settings := bucketSettings(t, a, "bucket", time.Second)
	envoys := []*rlqsclient.Client{rlqsEnvoy(t, a.grpcAddr, settings), rlqsEnvoy(t, b.grpcAddr, settings),
		rlqsEnvoy(t, a.grpcAddr, settings), rlqsEnvoy(t, b.grpcAddr, settings)}
	id := map[string]string{"policy": policyName, "rule": "bucket", "user": "hot"}

	var mu sync.Mutex
	var admitted []int64 // Unix ns
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	every := time.Second * time.Duration(len(envoys)) / (2 * bucketRate) // twice the rate, all Envoys together
	for i, c := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				at := start.Add(time.Duration(i)*rlqsclient.EnvoyReportInterval/time.Duration(len(envoys)) + time.Duration(n)*every)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(at)):
				}
				if c.Decide(id) {
					mu.Lock()
					admitted = append(admitted, time.Now().UnixNano())
					mu.Unlock()
				}
			}
		}()
	}
	at := func(d time.Duration) {
		time.Sleep(time.Until(start.Add(d))) // the fault schedule: traffic runs meanwhile
	}
	at(25 * time.Second)
	killed := time.Now()
	b.p.Kill()
	at(33 * time.Second)
	b.p.Start()
	b.await(t)
	restarted := time.Now()
	at(time.Minute)
	cancel()
	wg.Wait()
	end := time.Now()

	mu.Lock()
	defer mu.Unlock()
	for _, span := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second} {
		if got, most := spans.MostWithin(admitted, span), bucketBurst+int(bucketRate*span/time.Second); got > most {
			t.Errorf("%d admitted within %v, over the capacity plus refill %d", got, span, most)
		}
	}
	rate := func(from, to time.Time) float64 {
		n := 0
		for _, x := range admitted {
			if x >= from.UnixNano() && x < to.UnixNano() {
				n++
			}
		}
		return float64(n) / to.Sub(from).Seconds()
	}
	for _, p := range []struct {
		what     string
		from, to time.Time
	}{
		{"before the kill", start.Add(10 * time.Second), killed},
		{"after the restart", restarted.Add(15 * time.Second), end},
	} {
		got := rate(p.from, p.to)
		t.Logf("%s (%.0f s): %.2f a second admitted, offered %d (rate %d, burst %d)", p.what, p.to.Sub(p.from).Seconds(), got, 2*bucketRate, bucketRate, bucketBurst)
		if got < 0.95*bucketRate {
			t.Errorf("%s: %.2f a second admitted, offered twice the rate of %d: want at least 95 %% of it", p.what, got, bucketRate)
		}
	}
	t.Logf("while a control plane was down: %.2f a second", rate(killed, restarted))
}
