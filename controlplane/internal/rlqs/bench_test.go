package rlqs

import (
	"context"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// benchPolicy never refuses: any denial would be a false one. BenchmarkRLQSReports
// reports on tb, whose leases follow one another with no window's end to wait
// for; the flood benchmarks on fw.
const benchPolicy = `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"fw","key":["user"],"algorithm":"fixed_window","limit":100000000,"window":"1h","scope":"fleet"},
 {"id":"tb","key":["user"],"algorithm":"token_bucket","limit":1000000000000,"window":"1h","scope":"fleet"}]}`

// serveLoopback serves srv over plaintext gRPC on a loopback port until the
// benchmark ends, and returns a connection to it.
func serveLoopback(b testing.TB, srv *Server) *grpc.ClientConn {
	b.Helper()
	g := NewGRPCServer(srv, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(l)
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// BenchmarkRLQSReports measures one replica serving RLQS over loopback gRPC with a
// real redis-server: streams × buckets per report, every bucket reporting that
// it spent its last token bucket (one request the first time) and was denied
// one more, and answered with a new one. It reports buckets/s (answered
// buckets per second of wall time) and the p50/p99 from sending a report to
// receiving its response.
func BenchmarkRLQSReports(b *testing.B) {
	rs := redisproc.Start(b)
	o := &redis.UniversalOptions{Addrs: []string{rs.Addr()}}
	quota.TuneClient(o)
	rc := redis.NewUniversalClient(o)
	defer rc.Close()
	pol := &policies{}
	pol.set(b, benchPolicy)
	q := quota.New(quota.Options{Backend: quota.NewRedis(rc), Policies: pol, Open: true})
	conn := serveLoopback(b, New(Options{Quota: q}))
	for _, tc := range []struct{ streams, buckets int }{{1, 1}, {1, 10}, {1, 100}, {4, 100}, {32, 10}} {
		b.Run("streams="+strconv.Itoa(tc.streams)+"/buckets="+strconv.Itoa(tc.buckets), func(b *testing.B) {
			reports := make([]*rlqsv3.RateLimitQuotaUsageReports, tc.streams)
			streams := make([]rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, tc.streams)
			for s := range streams {
				r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "bench"}
				for k := range tc.buckets {
					r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"policy": "p", "rule": "tb", "user": b.Name() + "/" + strconv.Itoa(s) + "/" + strconv.Itoa(k)}},
						NumRequestsAllowed: 1, NumRequestsDenied: 1})
				}
				reports[s] = r
				st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				streams[s] = st
			}
			lat := make([][]time.Duration, tc.streams)
			per := (b.N + tc.streams - 1) / tc.streams
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for s := range streams {
				wg.Add(1)
				go func(s int) {
					defer wg.Done()
					for range per {
						t0 := time.Now()
						if err := streams[s].Send(reports[s]); err != nil {
							b.Error(err)
							return
						}
						resp, err := streams[s].Recv()
						if err != nil {
							b.Error(err)
							return
						}
						lat[s] = append(lat[s], time.Since(t0))
						for i, a := range applied(resp) {
							tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
							if tb == nil {
								b.Errorf("not a token bucket: %v", a)
								return
							}
							// The next report spends all of it and was denied one more, as
							// a busy Envoy's does: asking for more than the live token
							// bucket may still hold. (Reports sent as fast as answers
							// come are each answered before the last assignment could
							// have admitted a request, at the bucket's pace: with no
							// more demand, the server would withhold a grant no larger,
							// and send no answer to wait for.)
							reports[s].BucketQuotaUsages[i].NumRequestsAllowed = uint64(tb.GetMaxTokens())
						}
						if len(applied(resp)) != tc.buckets {
							b.Errorf("%d actions for %d buckets", len(applied(resp)), tc.buckets)
							return
						}
					}
				}(s)
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			for _, st := range streams {
				_ = st.CloseSend()
			}
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			if len(all) == 0 {
				return
			}
			b.ReportMetric(float64(len(all)*tc.buckets)/elapsed.Seconds(), "buckets/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
