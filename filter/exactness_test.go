package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
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

// TestCASExhaustionFailsOpenAccountably: with cas_fail_mode "open", a
// single CAS retry and 8 workers contending, requests that run out of
// retries pass undecided.
// Each of them says so (sluice.reason cas_exhausted, counted), and every
// other admission is exact: admitted − failed-open ≤ the limit.
func TestCASExhaustionFailsOpenAccountably(t *testing.T) {
	buildWasm(t)
	const workers, perWorker, limit = 8, 100, 200
	pol := `{"policy":"p","rules":[{"id":"g","algorithm":"fixed_window","limit":` + strconv.Itoa(limit) + `,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","cas_retries":1,"cas_fail_mode":"open","policy":`+pol+`}`, workers)
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
					if filterstate.Fields(resp.FilterState)["reason"] == "cas_exhausted" {
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

// hammerWindow is the fixed window of the hot-key hammer: 365 days, so the
// epoch-aligned window almost never ends during a run (the test skips if it
// does).
const hammerWindow = 365 * 24 * time.Hour

// hammer drives workers worker VMs on the real clock, each from its own
// goroutine, perWorker requests each, all counted by one global
// fixed-window key. It returns the number admitted and the number that
// passed or were denied with sluice.reason cas_exhausted; every request
// with that reason must be a 429 with details sluice_cas_exhausted unless
// openOnExhaustion.
func hammer(t testing.TB, cfg string, workers, perWorker int, openOnExhaustion bool) (admitted, exhausted int64) {
	t.Helper()
	bin := buildWasmTB(t)
	h, err := host.New(context.Background(), host.Config{
		Wasm: bin, VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
		Workers: workers, Clock: host.SystemClock, LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	defer h.Close()
	var adm, exh atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	before := time.Now().UnixNano() / int64(hammerWindow)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) { // one goroutine per worker VM: a VM is not goroutine-safe
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				resp, err := h.Worker(w).Do(context.Background(), host.Request{Path: "/"})
				if err != nil {
					errs <- err
					return
				}
				if filterstate.Fields(resp.FilterState)["reason"] == "cas_exhausted" {
					exh.Add(1)
					if !openOnExhaustion && (resp.Status != 429 || resp.LocalReply == nil || resp.LocalReply.Details != "sluice_cas_exhausted") {
						errs <- &statusError{resp.Status}
						return
					}
				}
				switch resp.Status {
				case 200:
					adm.Add(1)
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
	if time.Now().UnixNano()/int64(hammerWindow) != before {
		t.Skip("the run crossed a window boundary")
	}
	for _, l := range h.Logs() {
		if l.Level >= host.LogError {
			t.Errorf("guest error log (worker %d): %.3000s", l.Worker, l.Message)
		}
	}
	return adm.Load(), exh.Load()
}

// hammerConfig is a plugin configuration (extra: more members, each
// followed by a comma) whose policy has rules global fixed-window rules
// g0, g1, ...: g0 allows limit, each next one 100 more, so g0 decides.
func hammerConfig(rules, limit int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"tick":"1m",` + extra + `"policy":{"policy":"p","rules":[`)
	for i := 0; i < rules; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"g` + strconv.Itoa(i) + `","algorithm":"fixed_window","limit":` +
			strconv.Itoa(limit+100*i) + `,"window":"` + hammerWindow.String() + `"}`)
	}
	b.WriteString(`]}}`)
	return b.String()
}

// TestHotKeyExactUnderContention: 8 worker VMs hammer one global key at
// once on the real clock, with the default configuration. Every request
// is decided from the counter (none passes or is refused as
// cas_exhausted) and exactly the limit is admitted: the rule holds under a
// flood, when its key is hottest.
func TestHotKeyExactUnderContention(t *testing.T) {
	const workers, perWorker, limit = 8, 400, 2400
	admitted, exhausted := hammer(t, hammerConfig(1, limit, ""), workers, perWorker, false)
	if exhausted != 0 {
		t.Errorf("%d of %d requests were not decided from the counter (cas_exhausted)", exhausted, workers*perWorker)
	}
	if admitted != limit {
		t.Errorf("admitted %d, want exactly %d", admitted, limit)
	}
}

// TestHotGlobalRulesExactUnderContention: the same flood on a policy of
// 16 global rules, every one of them written by every admitted request, so
// each request meets contention on 16 hot keys. With the default
// configuration every request is still decided from the counters and
// exactly the smallest limit is admitted.
func TestHotGlobalRulesExactUnderContention(t *testing.T) {
	const workers, perWorker, rules, limit = 8, 500, 16, 3000
	admitted, exhausted := hammer(t, hammerConfig(rules, limit, ""), workers, perWorker, false)
	if exhausted != 0 {
		t.Errorf("%d of %d requests were not decided from the counters (cas_exhausted)", exhausted, workers*perWorker)
	}
	if admitted != limit {
		t.Errorf("admitted %d, want exactly %d", admitted, limit)
	}
	t.Logf("%d requests, %d admitted", workers*perWorker, admitted)
}

// TestCASExhaustionDeniesByDefault: with a single CAS retry per rule, the
// flood on 16 global rules runs some requests out of retries. With the
// default cas_fail_mode "closed" each of them is denied (429, details
// sluice_cas_exhausted, reason cas_exhausted) after its charges are taken
// back, so the smallest limit is still admitted exactly: never more, and
// the requests after a denial fill any gap.
func TestCASExhaustionDeniesByDefault(t *testing.T) {
	const workers, perWorker, rules, limit = 8, 500, 16, 3000
	admitted, exhausted := hammer(t, hammerConfig(rules, limit, `"cas_retries":1,`), workers, perWorker, false)
	if admitted != limit {
		t.Errorf("admitted %d, want exactly %d", admitted, limit)
	}
	t.Logf("%d requests denied for want of CAS retries", exhausted)
}

// BenchmarkHotKeyContention: 8 worker VMs, each driven from its own
// goroutine, send b.N requests in all that every global rule of the policy
// admits (limits no run reaches), so every request writes every rule's one
// hot bucket and the workers contend on each. ns/op is wall time per
// request across the 8 workers; retries/op the CAS re-reads per request;
// exhausted/op the requests that ran out of retries.
//
//	go test ./filter -run '^$' -bench HotKeyContention -benchtime 4000x -count 5
func BenchmarkHotKeyContention(b *testing.B) {
	for _, rules := range []int{1, 16} {
		b.Run("rules="+strconv.Itoa(rules), func(b *testing.B) {
			const workers = 8
			e := newEnv(b, hammerConfig(rules, 1_000_000_000, ""), workers)
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := 0; w < workers; w++ {
				n := b.N / workers
				if w < b.N%workers {
					n++
				}
				wg.Add(1)
				go func(w, n int) {
					defer wg.Done()
					for i := 0; i < n; i++ {
						resp, err := e.h.Worker(w).Do(context.Background(), host.Request{Path: "/"})
						if err != nil || resp.Status != 200 {
							b.Errorf("worker %d: status %d, %v", w, resp.Status, err)
							return
						}
					}
				}(w, n)
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(e.metric("sluice.cas_retries"))/float64(b.N), "retries/op")
			b.ReportMetric(float64(e.metric("sluice.cas_exhausted"))/float64(b.N), "exhausted/op")
		})
	}
}
