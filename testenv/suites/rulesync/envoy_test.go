package rulesync

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// workers is the number of worker VMs of every test Envoy.
const workers = 4

// tick and lease are the plugin's "tick" and control_plane "lease".
const (
	tick  = 100 * time.Millisecond
	lease = time.Second
)

// envoy is one Envoy: the real sluice.wasm under the testenv host with
// four workers, its control_plane cluster pointing at cpAddr.
type envoy struct {
	t     testing.TB
	h     *host.Host
	clock host.Clock
	// virtual is clock when it is a *host.VirtualClock, else nil.
	virtual *host.VirtualClock
}

// pluginConfig is the filter's configuration for these tests; wait is the
// long-poll wait, extra more members (e.g. a static "policy") or "". No
// request is held for the first policy (first_policy_wait 0s): the probes that
// wait for a version would otherwise wait for a tick of the virtual clock,
// which only the probing goroutine advances.
func pluginConfig(wait time.Duration, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"control_plane":{"cluster":"control_plane","authority":"cp.test","policy":"` + policyName +
		`","token":"` + readToken + `","wait":"` + wait.String() + `","timeout":"` + (wait + 5*time.Second).String() +
		`","lease":"` + lease.String() + `","first_policy_wait":"0s"},"tick":"` + tick.String() + `"` + extra + `}`
}

// startEnvoy starts the host with pluginConfig(wait, ""); clock nil means
// the real clock.
func startEnvoy(t testing.TB, cpAddr string, clock host.Clock, wait time.Duration) *envoy {
	t.Helper()
	return startEnvoyConfig(t, cpAddr, clock, pluginConfig(wait, ""))
}

// startEnvoyConfig starts the host with the plugin configuration cfg.
func startEnvoyConfig(t testing.TB, cpAddr string, clock host.Clock, cfg string) *envoy {
	t.Helper()
	e := &envoy{t: t, clock: clock}
	if clock == nil {
		e.clock = host.SystemClock
	}
	e.virtual, _ = clock.(*host.VirtualClock)
	h, err := host.New(context.Background(), host.Config{
		Wasm: wasmBin, VMID: "sluice", PluginName: "sluice",
		PluginConfig: []byte(cfg),
		Workers:      workers, Clock: e.clock,
		Clusters: map[string]string{"control_plane": cpAddr},
		LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	e.h = h
	t.Cleanup(func() {
		h.Close()
		if t.Failed() {
			for _, l := range h.Logs() {
				t.Logf("worker %d: %s: %s", l.Worker, l.Level, l.Message)
			}
		}
	})
	return e
}

// do sends GET path through worker i.
func (e *envoy) do(i int, path string) host.Response {
	e.t.Helper()
	resp, err := e.h.Worker(i).Do(bounded(e.t, 10*time.Second), host.Request{Path: path})
	if err != nil {
		e.t.Fatalf("worker %d: GET %s: %v", i, path, err)
	}
	return resp
}

// version is the policy version worker i enforces ("" before any
// policy): a probe request makes it check for a newer one, and its log
// says which it took up (proctest.WorkerVersions).
func (e *envoy) version(i int) string {
	e.t.Helper()
	e.do(i, "/probe")
	return e.loggedVersion(i)
}

// loggedVersion is the last policy version worker i logged as in use, ""
// if none.
func (e *envoy) loggedVersion(i int) string {
	if v, ok := proctest.WorkerVersions(e.h.Logs(), "default")[i]; ok {
		return strconv.FormatUint(v, 10)
	}
	return ""
}

// advance moves a virtual clock by one tick; with the real clock it sleeps
// for one tick.
func (e *envoy) advance() {
	if e.virtual != nil {
		e.virtual.Advance(tick)
		return
	}
	time.Sleep(tick)
}

// awaitVersion waits until every live worker enforces version v, moving a
// virtual clock tick by tick meanwhile; it fails the test after limit of
// real time.
func (e *envoy) awaitVersion(v uint64, limit time.Duration, live ...int) {
	e.t.Helper()
	if live == nil {
		live = allWorkers()
	}
	want := strconv.FormatUint(v, 10)
	var last []string
	ok := proctest.WaitFor(limit, func() bool {
		last = last[:0]
		done := true
		for _, i := range live {
			got := e.version(i)
			last = append(last, got)
			done = done && got == want
		}
		if !done {
			e.advance()
		}
		return done
	})
	if !ok {
		e.t.Fatalf("workers %v enforce versions %q after %v, want %s everywhere", live, last, limit, want)
	}
}

func allWorkers() []int {
	out := make([]int, workers)
	for i := range out {
		out[i] = i
	}
	return out
}

func (e *envoy) metric(name string) int64 {
	m, _ := e.h.Metric(name)
	return m.Value
}

// logsWith returns the log entries containing s.
func (e *envoy) logsWith(s string) []host.LogEntry {
	var out []host.LogEntry
	for _, l := range e.h.Logs() {
		if strings.Contains(l.Message, s) {
			out = append(out, l)
		}
	}
	return out
}

// holder returns the worker that took the sync lease last, by its log.
func (e *envoy) holder() int {
	e.t.Helper()
	var took []host.LogEntry
	proctest.WaitFor(5*time.Second, func() bool {
		took = e.logsWith("took the sync lease")
		if len(took) == 0 {
			e.advance()
		}
		return len(took) > 0
	})
	if len(took) == 0 {
		e.t.Fatal("no worker took the sync lease")
	}
	return took[len(took)-1].Worker
}

// twoRules is a policy with token buckets "a" on /a and "b" on /b, limits
// la and lb per hour, each one global counter.
func twoRules(la, lb int) string {
	rule := func(id string, l int) string {
		return `{"id":"` + id + `","match":{"path_prefix":"/` + id + `"},"algorithm":"token_bucket","limit":` +
			strconv.Itoa(l) + `,"window":"1h"}`
	}
	return `{"policy":"` + policyName + `","rules":[` + rule("a", la) + `,` + rule("b", lb) + `]}`
}

// admitted sends n requests for path spread over the workers and returns
// how many were let through (not answered 429).
func (e *envoy) admitted(path string, n int) int {
	e.t.Helper()
	ok := 0
	for k := range n {
		resp := e.do(k%workers, path)
		switch resp.Status {
		case 200:
			ok++
		case 429:
		default:
			e.t.Fatalf("GET %s: status %d", path, resp.Status)
		}
	}
	return ok
}

// traffic sends requests to every worker, one goroutine per worker, each
// pausing gap between requests, until stop is closed; seen gets the policy
// version each response was decided under. It is the traffic under which
// the propagation measurement watches for a new version.
func (e *envoy) traffic(path string, gap time.Duration, stop <-chan struct{}, seen func(worker int, version string, at time.Time)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.h.Worker(i).Do(context.Background(), host.Request{Path: path}); err != nil {
					return
				}
				seen(i, e.loggedVersion(i), time.Now())
				time.Sleep(gap)
			}
		}()
	}
	return &wg
}
