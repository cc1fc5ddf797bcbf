package rulesync

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// measuring skips t unless SLUICE_MEASURE=1: the measurements take minutes
// and their figures are logged, never asserted.
func measuring(t *testing.T) {
	t.Helper()
	if os.Getenv("SLUICE_MEASURE") != "1" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestMeasurePropagation measures, in real time, how long after a PUT
// returns every worker enforces the new version: for each change, the
// latest over the four workers of the first request answered under it,
// while every worker serves a request every SLUICE_MEASURE_GAP_MICROS µs
// (default 1000: about 4000 requests/s in all; unpaced traffic saturates
// this 2-core machine and starves the control plane and Redis, so the
// figure would measure the test's CPU contention). SLUICE_MEASURE_CHANGES
// sets the number of changes (default 100).
func TestMeasurePropagation(t *testing.T) {
	measuring(t)
	changes := envInt("SLUICE_MEASURE_CHANGES", 100)
	gap := time.Duration(envInt("SLUICE_MEASURE_GAP_MICROS", 1000)) * time.Microsecond
	cp := startControlPlane(t, startRedis(t))
	px := newPollProxy(t, cp.addr)
	e := startEnvoy(t, px.addr(), nil, 30*time.Second)
	v0 := cp.put(twoRules(3, 3))
	e.awaitVersion(v0, 10*time.Second)

	var mu sync.Mutex
	first := map[string]*[workers]time.Time{}
	stop := make(chan struct{})
	wg := e.traffic("/probe", gap, stop, func(w int, v string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		f := first[v]
		if f == nil {
			f = new([workers]time.Time)
			first[v] = f
		}
		if f[w].IsZero() {
			f[w] = at
		}
	})
	defer func() { close(stop); wg.Wait() }()

	lat := make([]time.Duration, 0, changes)
	for k := range changes {
		time.Sleep(time.Duration(rand.Int64N(int64(tick)))) // no phase lock with the ticks
		v := cp.put(twoRules(3, 4+k))
		t0 := time.Now()
		key := strconv.FormatUint(v, 10)
		var done time.Time
		ok := proctest.WaitFor(10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			f := first[key]
			if f == nil {
				return false
			}
			done = time.Time{}
			for _, at := range f {
				if at.IsZero() {
					return false
				}
				if at.After(done) {
					done = at
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("change %d (version %d) not enforced by every worker within 10s", k, v)
		}
		lat = append(lat, done.Sub(t0))
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	total, _, maxOpen := px.counts()
	t.Logf("propagation over %d changes (PUT returned → every one of %d workers answered under the new version): "+
		"p50 %v, p90 %v, p99 %v, max %v (tick %v, request gap %v); long polls %d, at most %d open at once",
		len(lat), workers, q(0.50), q(0.90), q(0.99), lat[len(lat)-1], tick, gap, total, maxOpen)
}

// TestMeasureIdleLoad counts the control plane's requests from one idle
// Envoy with four workers and the default 30 s wait, over
// SLUICE_MEASURE_IDLE_SECONDS (default 125).
func TestMeasureIdleLoad(t *testing.T) {
	measuring(t)
	idle := time.Duration(envInt("SLUICE_MEASURE_IDLE_SECONDS", 125)) * time.Second
	cp := startControlPlane(t, startRedis(t))
	px := newPollProxy(t, cp.addr)
	v := cp.put(twoRules(3, 3))
	e := startEnvoy(t, px.addr(), nil, 30*time.Second)
	e.awaitVersion(v, 10*time.Second)
	before, _, _ := px.counts()
	time.Sleep(idle)
	after, _, maxOpen := px.counts()
	n := after - before
	t.Logf("idle for %v: %d requests to the control plane, %.2f per minute (%d workers, wait 30s), at most %d open at once",
		idle, n, float64(n)/idle.Minutes(), workers, maxOpen)
}

// TestMeasurePropagationIdle is TestMeasurePropagation without traffic:
// workers then apply a new version on their tick alone. The time a worker
// applied it is when its "version N in use" log line (the plugin's
// swapPolicy) is first seen, polling the host's logs every 1 ms.
func TestMeasurePropagationIdle(t *testing.T) {
	measuring(t)
	changes := envInt("SLUICE_MEASURE_CHANGES", 100)
	cp := startControlPlane(t, startRedis(t))
	e := startEnvoy(t, cp.addr, nil, 30*time.Second)
	v0 := cp.put(twoRules(3, 3))
	e.awaitVersion(v0, 10*time.Second)
	lat := make([]time.Duration, 0, changes)
	for k := range changes {
		time.Sleep(time.Duration(rand.Int64N(int64(tick))))
		v := cp.put(twoRules(3, 4+k))
		t0 := time.Now()
		line := "version " + strconv.FormatUint(v, 10) + " in use"
		deadline := t0.Add(10 * time.Second)
		for {
			var seen [workers]bool
			n := 0
			for _, l := range e.h.Logs() {
				if l.Worker >= 0 && !seen[l.Worker] && strings.Contains(l.Message, line) {
					seen[l.Worker] = true
					n++
				}
			}
			if n == workers {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("change %d (version %d) applied by %d of %d workers within 10s", k, v, n, workers)
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	t.Logf("idle propagation over %d changes (PUT returned → all %d workers applied it, no traffic): "+
		"p50 %v, p90 %v, p99 %v, max %v (tick %v)", len(lat), workers, q(0.50), q(0.90), q(0.99), lat[len(lat)-1], tick)
}
