// Command rlsload drives a rate limit service of Envoy's global rate limiting
// API (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, the API of
// Envoy's envoy.filters.http.ratelimit filter and of envoyproxy/ratelimit) over
// loopback gRPC, and reports what it measured: decisions per second, per CPU
// second of the service's process, latency percentiles, the Redis commands the
// service sent per decision, and what one key was admitted per window.
//
//	rlsload -addr 127.0.0.1:8081 -domain bench -descriptor 'generic_key=bench,user=u{n}' \
//	  -keys 1000 -workers 32 -duration 20s -redis 127.0.0.1:6379 -pid $(pgrep ratelimit)
//
// Each call is one RateLimitRequest of one descriptor: the entries of
// -descriptor, in order, with {n} in a value replaced by the call's key index
// (0 … -keys−1, in turn; key 0 is the one counted per window). -workers calls
// are in flight at once, each sent as soon as the one before it was answered
// (a closed loop), until -duration has passed or -requests were sent. With -redis
// the service's Redis is read (INFO commandstats) before and after; with -pid the
// process's user and system CPU time (Linux /proc/PID/stat). The load goes to a
// loopback address only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(1)
	}
}

// options are the command line's.
type options struct {
	addr, domain, descriptor, redisAddr string
	keys, workers, requests, pid        int
	duration, window                    time.Duration
}

// run runs the command with args (the command line without the program name)
// and writes its report to out.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rlsload", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.addr, "addr", "", "the service's gRPC address, host:port on loopback (required)")
	fs.StringVar(&o.domain, "domain", "", "the RateLimitRequest domain (required)")
	fs.StringVar(&o.descriptor, "descriptor", "", "the descriptor's entries, key=value,key=value; {n} in a value is the key index (required)")
	fs.IntVar(&o.keys, "keys", 1, "distinct values of {n}, in turn")
	fs.IntVar(&o.workers, "workers", 16, "calls in flight at once")
	fs.IntVar(&o.requests, "requests", 1_000_000, "the most calls to send")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to send calls")
	fs.DurationVar(&o.window, "window", time.Second, "the window key 0's admitted calls are counted in")
	fs.StringVar(&o.redisAddr, "redis", "", "the service's Redis, host:port, for its commands per decision (none: not counted)")
	fs.IntVar(&o.pid, "pid", 0, "the service's process, for its CPU time (0: not measured)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	entries, err := parseDescriptor(o.descriptor)
	switch {
	case err != nil:
		return err
	case o.domain == "":
		return errors.New("-domain is required")
	case o.keys < 1 || o.workers < 1 || o.requests < 1 || o.duration <= 0 || o.window <= 0:
		return errors.New("-keys, -workers, -requests, -duration and -window must be positive")
	}
	if err := loopback(o.addr); err != nil {
		return err
	}
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var rdb *redis.Client
	if o.redisAddr != "" {
		if err := loopback(o.redisAddr); err != nil {
			return err
		}
		rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr})
		defer rdb.Close()
	}
	res, err := drive(ctx, rlsv3.NewRateLimitServiceClient(conn), rdb, o, entries)
	if err != nil {
		return err
	}
	res.print(out, o)
	return nil
}

// entry is one descriptor entry; value may hold {n}.
type entry struct{ key, value string }

// parseDescriptor reads key=value,key=value.
func parseDescriptor(s string) ([]entry, error) {
	if s == "" {
		return nil, errors.New("-descriptor is required")
	}
	var out []entry
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("-descriptor: %q is not key=value", part)
		}
		out = append(out, entry{k, v})
	}
	return out, nil
}

// loopback refuses an address that is not a loopback IP and port.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q: load goes to a loopback address only", addr)
	}
	return nil
}

// requests builds the call of each key index.
func requests(domain string, entries []entry, keys int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, keys)
	for n := range out {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range entries {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.key, Value: strings.ReplaceAll(e.value, "{n}", strconv.Itoa(n))})
		}
		out[n] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	}
	return out
}

// result is what a run measured.
type result struct {
	calls, ok, over, failed uint64
	elapsed                 time.Duration
	latencies               []time.Duration // sorted
	cpu                     time.Duration   // the service's, -1 if not measured
	redisCalls              int64           // -1 if not measured
	redisCPU                time.Duration   // Redis's user and system CPU time, -1 if not measured
	perWindow               map[int64]int   // key 0's admitted calls by window start (Unix ns)
	firstFailure            string          // the first failed call's error or code
}

// drive sends the calls and measures them.
func drive(ctx context.Context, c rlsv3.RateLimitServiceClient, rdb *redis.Client, o options, entries []entry) (*result, error) {
	reqs := requests(o.domain, entries, o.keys)
	res := &result{cpu: -1, redisCalls: -1, redisCPU: -1, perWindow: map[int64]int{}}
	var cpu0 time.Duration
	if o.pid > 0 {
		var err error
		if cpu0, err = cpuTime(o.pid); err != nil {
			return nil, err
		}
	}
	var redis0 int64
	var redisCPU0 time.Duration
	if rdb != nil {
		var err error
		if redis0, err = redisCalls(ctx, rdb); err != nil {
			return nil, err
		}
		if redisCPU0, err = redisCPU(ctx, rdb); err != nil {
			return nil, err
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var next atomic.Int64 // calls handed out
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(ctx, runCtx, c, reqs, o, &next, res, &mu)
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.calls = res.ok + res.over + res.failed
	slices.Sort(res.latencies)
	if o.pid > 0 {
		cpu1, err := cpuTime(o.pid)
		if err != nil {
			return nil, err
		}
		res.cpu = cpu1 - cpu0
	}
	if rdb != nil {
		n, err := redisCalls(ctx, rdb)
		if err != nil {
			return nil, err
		}
		res.redisCalls = n - redis0
		c, err := redisCPU(ctx, rdb)
		if err != nil {
			return nil, err
		}
		res.redisCPU = c - redisCPU0
	}
	return res, nil
}

// work sends calls until o.requests are handed out (next counts them) or
// runCtx ends, and adds what it measured to res under mu.
func work(ctx, runCtx context.Context, c rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, o options,
	next *atomic.Int64, res *result, mu *sync.Mutex) {
	var lat []time.Duration
	var ok, over, failed uint64
	var first string
	fail := func(what string) {
		if failed++; first == "" {
			first = what
		}
	}
	windows := map[int64]int{}
	for runCtx.Err() == nil {
		i := next.Add(1) - 1
		if i >= int64(o.requests) {
			break
		}
		key := int(i % int64(o.keys))
		t0 := time.Now()
		// The call does not carry the run's deadline: gRPC sends it as
		// grpc-timeout, and a server enforcing it ends calls a little before
		// the client's clock does, which would count as failures.
		resp, err := c.ShouldRateLimit(ctx, reqs[key])
		if err != nil {
			fail(err.Error())
			continue
		}
		lat = append(lat, time.Since(t0))
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
			ok++
			if key == 0 {
				windows[t0.UnixNano()/int64(o.window)*int64(o.window)]++
			}
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over++
		default:
			fail("overall_code " + resp.GetOverallCode().String())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	res.latencies = append(res.latencies, lat...)
	res.ok, res.over, res.failed = res.ok+ok, res.over+over, res.failed+failed
	if res.firstFailure == "" {
		res.firstFailure = first
	}
	for w, n := range windows {
		res.perWindow[w] += n
	}
}

// percentile is the p-th percentile (0 < p ≤ 100) of sorted, 0 if empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// print writes the report: one line per figure, then key 0's admitted per window.
func (r *result) print(out io.Writer, o options) {
	decided := r.ok + r.over
	fmt.Fprintf(out, "calls %d in %.2fs: %d OK, %d OVER_LIMIT, %d failed\n", r.calls, r.elapsed.Seconds(), r.ok, r.over, r.failed)
	if r.firstFailure != "" {
		fmt.Fprintf(out, "first failure: %s\n", r.firstFailure)
	}
	fmt.Fprintf(out, "decisions/s %.0f\n", float64(decided)/r.elapsed.Seconds())
	if r.cpu >= 0 {
		perCore := 0.0
		if r.cpu > 0 {
			perCore = float64(decided) / r.cpu.Seconds()
		}
		fmt.Fprintf(out, "service CPU %.2fs: decisions per CPU second %.0f\n", r.cpu.Seconds(), perCore)
	}
	if r.cpu > 0 && r.redisCPU >= 0 {
		fmt.Fprintf(out, "Redis CPU %.2fs: decisions per CPU second of service and Redis %.0f\n", r.redisCPU.Seconds(), float64(decided)/(r.cpu+r.redisCPU).Seconds())
	}
	fmt.Fprintf(out, "latency p50 %v p99 %v\n", percentile(r.latencies, 50), percentile(r.latencies, 99))
	if r.redisCalls >= 0 && decided > 0 {
		fmt.Fprintf(out, "redis commands %d: %.3f per decision\n", r.redisCalls, float64(r.redisCalls)/float64(decided))
	}
	windows := make([]int64, 0, len(r.perWindow))
	for w := range r.perWindow {
		windows = append(windows, w)
	}
	slices.Sort(windows)
	for _, w := range windows {
		fmt.Fprintf(out, "key 0 window %s: %d admitted\n", time.Unix(0, w).UTC().Format("15:04:05.000"), r.perWindow[w])
	}
}

// redisCalls is the commands Redis has executed since it started (the sum of
// INFO commandstats' calls; the INFO itself included).
func redisCalls(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		_, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("redis INFO commandstats: %q: %w", line, err)
				}
				total += n
			}
		}
	}
	return total, nil
}

// redisCPU is the Redis server's user and system CPU time (INFO cpu:
// used_cpu_user and used_cpu_sys, seconds).
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || k != "used_cpu_user" && k != "used_cpu_sys" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("redis INFO cpu: %q: %w", line, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second)), nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times on Linux.
const clockTicks = 100

// cpuTime is the user and system CPU time of process pid (proc(5), fields 14
// and 15 of /proc/PID/stat, in clock ticks).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}
