package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestCrossWorkerExactness: 8 worker VMs on one host share a global limit of
// 1,000, driven concurrently from 8 goroutines, 1,600 requests in all.
// Exactly 1,000 are admitted. A second rule per client IP (300 each, 4
// clients) matches every request too, so the multi-rule commit and its
// compensation run under contention: no client exceeds 300 either.
func TestCrossWorkerExactness(t *testing.T) {
	buildWasm(t)
	const workers, perWorker, global, perIP = 8, 200, 1000, 300
	pol := `{"policy":"p","rules":[
	  {"id":"global","algorithm":"fixed_window","limit":` + strconv.Itoa(global) + `,"window":"1h"},
	  {"id":"per-ip","key":["client_ip"],"algorithm":"token_bucket","limit":` + strconv.Itoa(perIP) + `,"window":"24h"}]}`
	e := newEnv(t, `{"tick":"1m","cas_retries":1000,"policy":`+pol+`}`, workers)
	var admitted atomic.Int64
	var perClient [4]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				c := (w + i) % 4
				resp, err := e.h.Worker(w).Do(context.Background(), host.Request{
					Path: "/", Info: host.StreamInfo{SourceAddress: "192.0.2." + strconv.Itoa(c+1) + ":1000"},
				})
				if err != nil {
					errs <- err
					return
				}
				switch resp.Status {
				case 200:
					admitted.Add(1)
					perClient[c].Add(1)
				case 429:
				default:
					errs <- &statusError{resp.Status}
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != global {
		t.Errorf("admitted %d, want exactly %d", got, global)
	}
	for c := range perClient {
		if got := perClient[c].Load(); got > perIP {
			t.Errorf("client %d admitted %d, over its limit %d", c, got, perIP)
		}
	}
	if got := e.metric("sluice.cas_exhausted"); got != 0 {
		t.Errorf("cas_exhausted = %d", got)
	}
	if got := e.metric("sluice.rule.global.allowed"); got != global {
		t.Errorf("global allowed metric = %d", got)
	}
	t.Logf("CAS retries: %d, compensations lost: %d", e.metric("sluice.cas_retries"), e.metric("sluice.compensation_lost"))
	// Every later request is denied, from any worker.
	for w := 0; w < workers; w++ {
		if r := e.do(w, req{path: "/", src: "192.0.2.99:1"}); r.Status != 429 {
			t.Errorf("worker %d after the limit: %d", w, r.Status)
		}
	}
}

type statusError struct{ status int }

func (e *statusError) Error() string { return "unexpected status " + strconv.Itoa(e.status) }

// TestDeniedRequestConsumesNothing: a request denied by one rule takes
// nothing from the other matching rules.
func TestDeniedRequestConsumesNothing(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","rules":[
	  {"id":"a","key":["client_ip"],"algorithm":"fixed_window","limit":2,"window":"1m"},
	  {"id":"b","algorithm":"fixed_window","limit":3,"window":"10s"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	step := func(ip string, want int, wantRule string) {
		t.Helper()
		r := e.do(0, req{path: "/", src: ip + ":1"})
		if r.Status != want {
			t.Fatalf("%s: %d, want %d", ip, r.Status, want)
		}
		if wantRule != "" {
			wantState(t, r.FilterState, map[string]string{"sluice.rule": wantRule})
		}
	}
	step("192.0.2.1", 200, "")
	step("192.0.2.1", 200, "")
	step("192.0.2.1", 429, "a") // must not take b's third unit
	step("192.0.2.2", 200, "")  // b's third unit
	step("192.0.2.2", 429, "b") // must not take a's second unit for .2
	e.clock.Advance(10 * time.Second)
	step("192.0.2.2", 200, "") // a's second unit for .2
	step("192.0.2.2", 429, "a")
}

// TestCASExhaustionFailsOpenAccountably: with a single CAS retry and 8
// workers contending, some requests run out of retries and pass undecided.
// Each of them says so (sluice.reason cas_exhausted, counted), and every
// other admission is exact: admitted − failed-open ≤ the limit.
func TestCASExhaustionFailsOpenAccountably(t *testing.T) {
	buildWasm(t)
	const workers, perWorker, limit = 8, 100, 200
	pol := `{"policy":"p","rules":[{"id":"g","algorithm":"fixed_window","limit":` + strconv.Itoa(limit) + `,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","cas_retries":1,"policy":`+pol+`}`, workers)
	var admitted, exhausted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				resp, err := e.h.Worker(w).Do(context.Background(), host.Request{Path: "/"})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Status == 200 {
					admitted.Add(1)
					if resp.FilterState["wasm.sluice.reason"] == "cas_exhausted" {
						exhausted.Add(1)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	if got := e.metric("sluice.cas_exhausted"); got != exhausted.Load() {
		t.Errorf("cas_exhausted metric %d, filter state says %d", got, exhausted.Load())
	}
	if a, x := admitted.Load(), exhausted.Load(); a-x > limit || a < limit {
		t.Errorf("admitted %d with %d failed open; want admitted-failed ≤ %d ≤ admitted", a, x, limit)
	}
	t.Logf("admitted %d, failed open after CAS exhaustion %d", admitted.Load(), exhausted.Load())
}

// TestBucketKeysExistBeforeRequests: every counter key of the static
// policy exists once the plugin is configured, so no request ever writes an
// absent key. A write to an absent key succeeds whatever its cas (Envoy
// cannot create a key atomically), so two workers that both found a bucket
// absent would both win and one charge would be lost.
func TestBucketKeysExistBeforeRequests(t *testing.T) {
	buildWasm(t)
	const buckets = 8
	pol := `{"policy":"p","rules":[
	  {"id":"a","key":["client_ip"],"algorithm":"concurrency","limit":2},
	  {"id":"b","algorithm":"fixed_window","limit":5,"window":"1m"}]}`
	e := newEnv(t, `{"tick":"1m","buckets_per_rule":`+strconv.Itoa(buckets)+`,"policy":`+pol+`}`, 2)
	for _, rule := range []string{"a", "b"} {
		for n := 0; n < buckets; n++ {
			key := bucketKeyOf("p", rule, 16, buckets, n) // entries_per_bucket defaults to 16
			if _, _, ok := e.h.SharedData(key); !ok {
				t.Errorf("shared data %s absent after configure", key)
			}
		}
	}
}

// TestConcurrencyExactAcrossWorkers: workers racing to acquire slots of one
// concurrency key admit exactly the limit, round after round (every stream
// released between rounds).
func TestConcurrencyExactAcrossWorkers(t *testing.T) {
	buildWasm(t)
	const workers, perWorker, limit, rounds = 4, 3, 5, 20
	pol := `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[
	  {"id":"inflight","key":["user"],"algorithm":"concurrency","limit":` + strconv.Itoa(limit) + `,"lease":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","cas_retries":1000,"policy":`+pol+`}`, workers)
	for round := 0; round < rounds; round++ {
		var mu sync.Mutex
		var open []*host.Stream
		admitted := 0
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < perWorker; i++ {
					s, st := e.openStream(w, "/", "u")
					mu.Lock()
					open = append(open, s)
					if st == host.Continue {
						admitted++
					}
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()
		if admitted != limit {
			t.Fatalf("round %d: %d of %d requests in flight admitted, want exactly %d", round, admitted, workers*perWorker, limit)
		}
		for _, s := range open {
			e.finish(s, false)
		}
	}
}
