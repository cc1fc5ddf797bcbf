package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// counting is a rate limit service for the load generator's own test: it admits
// limit calls per descriptor (its entries' values) and counts each call with one
// INCR in a real redis-server.
type counting struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rdb   *redis.Client
	limit int
	mu    sync.Mutex
	seen  map[string]int
}

func (c *counting) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var key strings.Builder
	for _, e := range req.GetDescriptors()[0].GetEntries() {
		key.WriteString(e.GetKey() + "=" + e.GetValue() + ";")
	}
	if err := c.rdb.Incr(ctx, key.String()).Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[key.String()]++
	code := rlsv3.RateLimitResponse_OK
	if c.seen[key.String()] > c.limit {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

// TestTheReportCountsWhatTheServiceDid: 400 calls over 4 keys against a service
// that admits 10 per key and sends one Redis command per call are reported as
// 400 calls, 40 OK, 360 OVER_LIMIT, about one Redis command per decision, key
// 0's 10 admitted in its windows, and this process's CPU time.
func TestTheReportCountsWhatTheServiceDid(t *testing.T) {
	rs := redisproc.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, &counting{rdb: rdb, limit: 10, seen: map[string]int{}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	var out bytes.Buffer
	err = run(context.Background(), []string{"-addr", l.Addr().String(), "-domain", "d", "-descriptor", "generic_key=g,user=u{n}",
		"-keys", "4", "-workers", "4", "-requests", "400", "-duration", "1m", "-window", "1h",
		"-redis", rs.Addr(), "-pid", strconv.Itoa(os.Getpid())}, &out)
	if err != nil {
		t.Fatal(err)
	}
	report := out.String()
	t.Log(report)
	for _, want := range []string{"calls 400 in ", ": 40 OK, 360 OVER_LIMIT, 0 failed", "decisions/s ", "decisions per CPU second ", "latency p50 "} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// 400 INCRs, the INFO that read the count before, and each new
	// connection's handshake (HELLO, CLIENT SETINFO).
	_, rest, _ := strings.Cut(report, "redis commands ")
	n, err := strconv.Atoi(strings.SplitN(rest, ":", 2)[0])
	if err != nil || n < 401 || n > 401+3*8 {
		t.Errorf("redis commands: %q, want the service's 400 INCRs and at most a few handshakes more", rest)
	}
	var admitted int
	for line := range strings.SplitSeq(report, "\n") {
		if rest, ok := strings.CutPrefix(line, "key 0 window "); ok {
			_, n, _ := strings.Cut(rest, ": ")
			v, err := strconv.Atoi(strings.TrimSuffix(n, " admitted"))
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			admitted += v
		}
	}
	if admitted != 10 {
		t.Errorf("key 0 admitted %d over its windows, want 10", admitted)
	}
}

// TestLoadGoesToLoopbackOnly: a service or Redis that is not on a loopback
// address is refused before any call.
func TestLoadGoesToLoopbackOnly(t *testing.T) {
	for _, args := range [][]string{
		{"-addr", "192.0.2.1:8081", "-domain", "d", "-descriptor", "k=v"},
		{"-addr", "127.0.0.1:8081", "-domain", "d", "-descriptor", "k=v", "-redis", "192.0.2.1:6379"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, args, &bytes.Buffer{})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%v: %v, want a refusal naming loopback", args, err)
		}
	}
}
