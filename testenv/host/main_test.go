package host_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// The test plugins, built once per test binary by TestMain.
var (
	abiWasm      []byte // testenv/testdata/abiplugin
	initcallWasm []byte // the same with -tags abi_initcall
	osWasm       []byte // testenv/testdata/osplugin
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hosttest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	builds := []struct {
		out  *[]byte
		pkg  string
		tags string
	}{
		{&abiWasm, "../testdata/abiplugin", ""},
		{&initcallWasm, "../testdata/abiplugin", "abi_initcall"},
		{&osWasm, "../testdata/osplugin", ""},
	}
	var wg sync.WaitGroup
	errs := make([]error, len(builds))
	for i, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := filepath.Join(dir, fmt.Sprintf("plugin%d.wasm", i))
			args := []string{"build", "-buildmode=c-shared", "-o", out}
			if b.tags != "" {
				args = append(args, "-tags", b.tags)
			}
			cmd := exec.Command("go", append(args, b.pkg)...)
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if msg, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, msg)
				return
			}
			*b.out, errs[i] = os.ReadFile(out)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var epoch = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

// newHost starts a Host for the abiplugin with a virtual clock; cfg
// fields left zero get test defaults.
func newHost(t testing.TB, cfg host.Config) (*host.Host, *host.VirtualClock) {
	t.Helper()
	clock := host.NewVirtualClock(epoch)
	if cfg.Wasm == nil {
		cfg.Wasm = abiWasm
	}
	if cfg.VMID == "" {
		cfg.VMID = "sluice"
	}
	if cfg.PluginName == "" {
		cfg.PluginName = "abi_plugin"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock
	}
	h, err := host.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h, clock
}

func do(t testing.TB, w *host.Worker, req host.Request) host.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := w.Do(ctx, req)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	return resp
}

func op(name string, more ...string) host.Headers {
	h := host.Headers{{"x-op", name}}
	for i := 0; i+1 < len(more); i += 2 {
		h = append(h, [2]string{more[i], more[i+1]})
	}
	return h
}
