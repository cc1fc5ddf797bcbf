package fleetquota

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// The benchmarks run full streams through one worker of the testenv host
// running the real sluice.wasm, against a real control plane (embedded
// store) over loopback HTTP:
//
//	go test ./testenv/suites/fleetquota -run '^$' -bench . -benchtime 20000x
//
// BenchmarkWarmRule compares a rule with envoy scope and the same rule with
// fleet scope whose key holds quota (top-ups on a 100 ms quota_interval keep
// it warm); it reports quota calls per admitted request and the share of
// requests that waited. BenchmarkColdKey sends each request for a new user:
// one quota round trip each; it reports p50 and p99 per request.

func benchEnvoy(b *testing.B, scope string) (*quotaProxy, *envoy) {
	b.Helper()
	cp := startControlPlane(b, "")
	v := cp.put(fleetPolicy(`"algorithm":"fixed_window","limit":1000000000000,"window":"1h"` + scope))
	qp := newQuotaProxy(b, cp.addr)
	return qp, startEnvoy(b, qp.addr(), 1, `,"quota_interval":"100ms"`, v)
}

func BenchmarkWarmRule(b *testing.B) {
	for _, c := range []struct{ name, scope string }{{"envoy", ""}, {"fleet", `,"scope":"fleet"`}} {
		b.Run(c.name, func(b *testing.B) {
			qp, e := benchEnvoy(b, c.scope)
			w := e.h.Worker(0)
			req := host.Request{Path: "/api", Headers: host.Headers{{"x-user", "hot"}}}
			ctx := context.Background()
			if _, err := w.Do(ctx, req); err != nil { // warm the key
				b.Fatal(err)
			}
			calls0 := qp.count()
			waited := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := w.Do(ctx, req)
				if err != nil || r.Status != 200 {
					b.Fatalf("%v %d", err, r.Status)
				}
				if filterstate.Fields(r.FilterState)["quota"] == "waited" {
					waited++
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(qp.count()-calls0)/float64(b.N), "calls/req")
			b.ReportMetric(float64(waited)/float64(b.N), "waited/req")
		})
	}
}

func BenchmarkColdKey(b *testing.B) {
	qp, e := benchEnvoy(b, `,"scope":"fleet"`)
	_ = qp
	w := e.h.Worker(0)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := host.Request{Path: "/api", Headers: host.Headers{{"x-user", "cold-" + strconv.Itoa(i)}}}
		start := time.Now()
		r, err := w.Do(ctx, req)
		lat = append(lat, time.Since(start))
		if err != nil || r.Status != 200 || filterstate.Fields(r.FilterState)["quota"] != "waited" {
			b.Fatalf("%v %d %v", err, r.Status, r.FilterState)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
