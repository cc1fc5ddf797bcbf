// Command reqcost runs full request streams of a proxy-wasm module through one
// worker VM of the testenv host (wazero, virtual clock), so that a counter of
// executed instructions can price one request. Wall-clock benchmarks on a shared
// two-core machine scatter by tens of percent from run to run; the instructions a
// run executes do not depend on its neighbours. Under valgrind's callgrind
// (GOMAXPROCS=1 and GOGC=off keep the Go runtime's own work steady), the
// difference between a run of 2,500 and one of 500 requests, divided by 2,000, is
// the instructions one request costs, module and host together, start-up excluded:
//
//	go build -o /tmp/reqcost ./testenv/cmd/reqcost
//	for n in 500 2500; do
//	  GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 GOGC=off valgrind --tool=callgrind \
//	    --callgrind-out-file=/dev/null --smc-check=all \
//	    /tmp/reqcost -wasm build/sluice.wasm -config plugin.json -n $n 2>&1 | grep Collected
//	done
//
// Every request is GET of -path with x-user-id cycling over -users users and an
// x-request-id (Envoy sets one on every request), from 203.0.113.7:40000. Before
// the counted requests, -warm requests bring the module's buckets and buffers to
// their steady state. It exits non-zero if a request fails or answers other than
// -status.
//
// With -pause it prints "ready" after the warm-up and "done" after the counted
// requests, each on a line of its own, and waits after each for a line on its
// standard input, so that a profiler can count those requests alone. Built with
// wazero's perfmap build tag, the host writes /tmp/perf-<pid>.map naming each
// compiled function's code; callgrind started with --instr-atstart=no
// --dump-instr=yes and switched on at "ready" (callgrind_control -i on) then
// counts a request's instructions by address, and the map names their functions
// (docs/benchmarks.md, "One filter").
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "reqcost:", err)
		os.Exit(1)
	}
}

// run runs the command with args, the command line without the program name;
// with -pause it talks to a profiler's driver over stdin and stdout.
func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("reqcost", flag.ContinueOnError)
	wasm := fs.String("wasm", "build/sluice.wasm", "the module")
	config := fs.String("config", "", "a file holding the plugin configuration (none: empty)")
	n := fs.Int("n", 1000, "the requests to run after the warm-up")
	warm := fs.Int("warm", 2000, "the requests to run first")
	users := fs.Int("users", 1000, "distinct x-user-id values, in turn")
	path := fs.String("path", "/api/x", "the :path of every request")
	status := fs.Int("status", 0, "the status every counted request must get (0: any)")
	pause := fs.Bool("pause", false, `print "ready" and "done" around the counted requests, waiting for a line of stdin after each`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *users < 1 || *n < 0 || *warm < 0 {
		return fmt.Errorf("-users must be positive, -n and -warm not negative")
	}
	bin, err := os.ReadFile(*wasm)
	if err != nil {
		return err
	}
	var cfg []byte
	if *config != "" {
		if cfg, err = os.ReadFile(*config); err != nil {
			return err
		}
	}
	h, err := host.New(context.Background(), host.Config{
		Wasm: bin, VMID: "reqcost", PluginConfig: cfg, NoCanary: true, LogLevel: host.LogWarn,
		Clock: host.NewVirtualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
	})
	if err != nil {
		return err
	}
	defer h.Close()
	ids := make([]string, *users)
	for i := range ids {
		ids[i] = "user-" + strconv.Itoa(i)
	}
	w := h.Worker(0)
	req := host.Request{Path: *path,
		Headers: host.Headers{{"x-user-id", ""}, {"x-request-id", "7f1c2b9e-0d3a-4c55-9e1b-0123456789ab"}},
		Info:    host.StreamInfo{SourceAddress: "203.0.113.7:40000"}}
	seq := 0
	send := func(count, want int) error {
		for range count {
			req.Headers[0][1] = ids[seq%len(ids)]
			seq++
			resp, err := w.Do(context.Background(), req)
			if err != nil {
				return fmt.Errorf("request %d: %w", seq, err)
			}
			if want != 0 && resp.Status != want {
				return fmt.Errorf("request %d: status %d, want %d", seq, resp.Status, want)
			}
		}
		return nil
	}
	if err := send(*warm, 0); err != nil {
		return err
	}
	if !*pause {
		return send(*n, *status)
	}
	in := bufio.NewReader(stdin)
	if err := handOver(stdout, in, "ready"); err != nil {
		return err
	}
	if err := send(*n, *status); err != nil {
		return err
	}
	return handOver(stdout, in, "done")
}

// handOver prints word on a line of its own and waits for a line from in.
func handOver(out io.Writer, in *bufio.Reader, word string) error {
	if _, err := fmt.Fprintln(out, word); err != nil {
		return err
	}
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting after %q: %w", word, err)
	}
	return nil
}
