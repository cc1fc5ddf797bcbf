package rlqs

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// rssBytes is this process's resident set (processRSS), 0 when it cannot be read.
func rssBytes() uint64 { return processRSS(os.Getpid()) }

// BenchmarkRLQSFloodMemory floods one replica (in-memory quota store, loopback
// gRPC, the default bounds) from one identity: 16 streams × 10,000 buckets, each id
// carrying a 4 KiB value, in messages under the 1 MiB limit (625 MiB in all). With
// "keyed" the value is the user id the rule keys on (kept as a digest, up to the
// identity's bound); with "unkeyed" it is an entry the rule does not key on
// (refused). It reports the growth of the heap in use and of the resident set
// across the flood (after a GC) and the buckets kept, and checks that a stream
// opened afterwards is served unless the flood filled its identity's bound. Run it alone: go test -run '^$' -bench RLQSFlood -benchtime 1x.
func BenchmarkRLQSFloodMemory(b *testing.B) {
	for _, kind := range []string{"keyed", "unkeyed"} {
		b.Run(kind, func(b *testing.B) {
			pol := &policies{}
			pol.set(b, benchPolicy)
			q := quota.New(quota.Options{Backend: quota.NewMemory(), Policies: pol, Open: true})
			srv := New(Options{Quota: q})
			conn := serveLoopback(b, srv)
			pad := strings.Repeat("p", 4<<10)
			runtime.GC()
			debug.FreeOSMemory()
			heap0, rss0 := heapInUse(), rssBytes()
			for range b.N {
				var wg sync.WaitGroup
				for s := 0; s < 16; s++ {
					wg.Add(1)
					go func(s int) {
						defer wg.Done()
						st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
						if err != nil {
							b.Error(err)
							return
						}
						for batch := 0; batch < 50; batch++ {
							if err := st.Send(floodReport(s, batch, pad, kind == "keyed")); err != nil {
								b.Error(err)
								return
							}
							if _, err := st.Recv(); err != nil {
								b.Error(err)
								return
							}
						}
						// The streams stay open: their buckets stay tracked.
					}(s)
				}
				wg.Wait()
			}
			runtime.GC()
			debug.FreeOSMemory()
			heap1, rss1 := heapInUse(), rssBytes()
			srv.bucketsMu.Lock()
			kept := srv.buckets
			srv.bucketsMu.Unlock()
			// A legitimate stream of another identity is served after the flood.
			st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "bench", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
				BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"policy": "p", "rule": "fw", "user": "legit"}}, NumRequestsAllowed: 1}}}); err != nil {
				b.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil || len(applied(resp)) != 1 {
				b.Fatalf("a stream after the flood: %v %v", resp, err)
			}
			// Served unless the flood filled its identity's bound (an open control
			// plane, as here, takes every caller for one identity; with certificates
			// another identity is served: TestAFloodOfBucketsIsBoundedInCountAndBytes).
			served := applied(resp)[0].GetQuotaAssignmentAction() != nil
			if served != (kept < DefaultMaxBucketsPerIdentity) {
				b.Fatalf("a stream after the flood: served %t with %d buckets kept", served, kept)
			}
			b.ReportMetric(float64(int64(heap1)-int64(heap0))/(1<<20), "heap-MiB")
			b.ReportMetric(float64(int64(rss1)-int64(rss0))/(1<<20), "rss-MiB")
			b.ReportMetric(float64(kept), "buckets")
		})
	}
}

// floodReport is report batch of flood stream s: 200 buckets of one request each,
// whose ids carry pad (4 KiB) in the user id the rule keys on (keyed) or in an
// entry it does not key on, so the server abandons the bucket.
func floodReport(s, batch int, pad string, keyed bool) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "bench"}
	for i := 0; i < 200; i++ {
		id := map[string]string{"policy": "p", "rule": "fw", "user": strconv.Itoa(s) + "-" + strconv.Itoa(batch*200+i)}
		if keyed {
			id["user"] += pad
		} else {
			id["header:x-pad"] = pad
		}
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: 1})
	}
	return r
}
