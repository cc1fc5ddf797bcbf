package rlqs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// floodServerEnv, set in a child's environment, makes the test binary a bare RLQS
// server on loopback (benchPolicy, in-memory quota store) instead of running
// tests: BenchmarkRLQSFloodServerPeak measures that process alone.
const floodServerEnv = "SLUICE_RLQS_FLOOD_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(floodServerEnv) != "" {
		os.Exit(serveFlood())
	}
	os.Exit(m.Run())
}

// serveFlood serves RLQS on a free loopback port, prints "listening <addr>" and
// serves until its standard input closes.
func serveFlood() int {
	pol, err := rules.ParsePolicy([]byte(benchPolicy))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pol.Version = 1
	p := &policies{m: map[string]store.Record{pol.Name: {Name: pol.Name, Version: 1, Doc: rules.EncodePolicy(pol)}}}
	srv := New(Options{Quota: quota.New(quota.Options{Backend: quota.NewMemory(), Policies: p, Open: true}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g := NewGRPCServer(srv, nil)
	go g.Serve(l)
	fmt.Println("listening", l.Addr())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the benchmark closes stdin
	g.Stop()
	return 0
}

// processRSS is the resident set of process pid (Linux /proc/PID/status VmRSS),
// 0 when it cannot be read.
func processRSS(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

// BenchmarkRLQSFloodServerPeak floods an RLQS server running in a process of its
// own (this test binary re-executed, floodServerEnv) as an abusive client would: 16
// streams × 10,000 buckets whose ids carry a 4 KiB entry the rule does not key on
// (every bucket abandoned), 625 MiB in messages under the 1 MiB limit, sent
// without awaiting the answers. It reports the server's resident set at its peak
// during the flood, over what it was before (peak-rss-MiB): what the server buffers
// for a client that sends faster than it reads, bounded by the flow-control
// windows (StreamWindowBytes, ConnWindowBytes). Run it alone:
//
//	go test -run '^$' -bench RLQSFloodServerPeak -benchtime 1x -count 5 ./controlplane/internal/rlqs/
func BenchmarkRLQSFloodServerPeak(b *testing.B) {
	for range b.N {
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), floodServerEnv+"=1")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
		if err != nil || !ok {
			cmd.Process.Kill()
			b.Fatalf("the server process: %q %v", line, err)
		}
		before := processRSS(cmd.Process.Pid)
		peak := floodFor(b, addr, cmd.Process.Pid)
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(int64(peak)-int64(before))/(1<<20), "peak-rss-MiB")
	}
}

// floodFor sends the flood to addr and returns the peak resident set of process
// pid while it lasted, sampled every 10 ms until every stream's answers stopped.
func floodFor(b *testing.B, addr string, pid int) uint64 {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if r := processRSS(pid); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	pad := strings.Repeat("p", 4<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for s := 0; s < 16; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			answers := make(chan struct{})
			go func() {
				defer close(answers)
				for n := 0; n < 50; n++ {
					if _, err := st.Recv(); err != nil {
						return
					}
				}
			}()
			for batch := 0; batch < 50; batch++ {
				if err := st.Send(floodReport(s, batch, pad, false)); err != nil {
					b.Error(err)
					return
				}
			}
			<-answers
		}(s)
	}
	wg.Wait()
	close(stop)
	<-sampled
	return peak.Load()
}
