package lab

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

var (
	wasmOnce sync.Once
	wasmBin  []byte
	wasmErr  error
)

// testModule returns the filter module: $SLUICE_WASM (make test sets it to
// build/sluice.wasm), else one built from ../../../filter for this test run.
func testModule(tb testing.TB) []byte {
	tb.Helper()
	wasmOnce.Do(func() {
		if p := os.Getenv("SLUICE_WASM"); p != "" {
			wasmBin, wasmErr = os.ReadFile(p)
			return
		}
		dir, err := os.MkdirTemp("", "lab-wasm")
		if err != nil {
			wasmErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "sluice.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../../../filter")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			wasmErr = fmt.Errorf("building the filter: %v\n%s", err, b)
			return
		}
		wasmBin, wasmErr = os.ReadFile(out)
	})
	if wasmErr != nil {
		tb.Fatal(wasmErr)
	}
	return wasmBin
}

func mustPolicy(tb testing.TB, doc string) *rules.Policy {
	tb.Helper()
	p, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// genRequest is one request of a generated log.
type genRequest struct {
	t    time.Time
	user string
	path string
	ip   string
}

// genLog makes n requests of users u0..u(users-1), one per distinct
// millisecond (so no two share a time), starting at start, about gap apart.
func genLog(seed uint64, n, users int, start time.Time, gap time.Duration) []genRequest {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]genRequest, n)
	t := start
	for i := range out {
		t = t.Add(time.Millisecond + time.Duration(r.Int64N(int64(2*gap))).Truncate(time.Millisecond))
		out[i] = genRequest{t: t, user: fmt.Sprintf("u%d", r.IntN(users)), path: "/api/items",
			ip: fmt.Sprintf("10.0.%d.%d", r.IntN(4), 1+r.IntN(200))}
	}
	return out
}

// writeLog writes reqs as envoy/envoy.yaml's JSON lines, shuffled within
// slack (as Envoy writes a line when its request ends), into path.
func writeLog(tb testing.TB, path string, reqs []genRequest, slack time.Duration, seed uint64) {
	tb.Helper()
	r := rand.New(rand.NewPCG(seed, 9))
	type keyed struct {
		end time.Time
		g   genRequest
	}
	ks := make([]keyed, len(reqs))
	for i, g := range reqs {
		var d time.Duration
		if slack > 0 {
			d = time.Duration(r.Int64N(int64(slack)))
		}
		ks[i] = keyed{g.t.Add(d), g}
	}
	sort.SliceStable(ks, func(i, j int) bool { return ks[i].end.Before(ks[j].end) })
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, k := range ks {
		g := k.g
		fmt.Fprintf(w, `{"timestamp":"%s","env":"prod","method":"GET","path":"%s","query":"","user_id":"%s","tenant_id":null,"client_ip":"%s","status_code":200,"response_time_ms":3,"rate_limit":null}`+"\n",
			g.t.UTC().Format("2006-01-02T15:04:05.000Z"), g.path, g.user, g.ip)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

// benchLines is BenchmarkReplay's log length.
var benchLines = flag.Int("lines", 100_000, "BenchmarkReplay: lines of the generated access log")
