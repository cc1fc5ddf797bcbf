package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Built once per test binary by TestMain, into a temporary directory.
var (
	binDir  string // sluice-controlplane, sluice-devproxy, sluice-echo, sluice.wasm
	wasmBin []byte
	repo    string // the repository root
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	var err error
	if repo, err = filepath.Abs("../.."); err != nil {
		return 1, err
	}
	if binDir, err = os.MkdirTemp("", "sluice-e2e"); err != nil {
		return 1, err
	}
	builds := [][]string{
		{"GOOS=wasip1", "GOARCH=wasm", "-buildmode=c-shared", "-o", filepath.Join(binDir, "sluice.wasm"), "./filter"},
		{"-o", filepath.Join(binDir, "sluice-controlplane"), "./controlplane/cmd/sluice-controlplane"},
		{"-o", filepath.Join(binDir, "sluice-devproxy"), "./testenv/cmd/sluice-devproxy"},
		{"-o", filepath.Join(binDir, "sluice-echo"), "./testenv/cmd/sluice-echo"},
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var env, args []string
			for _, a := range b {
				if strings.HasPrefix(a, "GO") {
					env = append(env, a)
				} else {
					args = append(args, a)
				}
			}
			cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
			cmd.Dir = repo
			cmd.Env = append(os.Environ(), env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 1, err
	}
	if wasmBin, err = os.ReadFile(filepath.Join(binDir, "sluice.wasm")); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// freeAddr returns a loopback address nobody listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitFor polls cond every 20ms until it holds or limit passes. Only used
// as a failure guard, never to assert a timing.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncBuffer is an io.Writer safe for a process's stdout and stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a child process the test can stop and start again with the
// same arguments.
type proc struct {
	t    testing.TB
	name string
	bin  string
	args []string
	env  []string
	cmd  *exec.Cmd
	out  *syncBuffer
}

func startProc(t testing.TB, name, bin string, args, env []string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, args: args, env: env, out: &syncBuffer{}}
	p.start()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out)
		}
	})
	return p
}

func (p *proc) start() {
	p.t.Helper()
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Dir = repo
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("starting %s: %v", p.name, err)
	}
}

// kill stops the process with SIGKILL (an outage, not a shutdown).
func (p *proc) kill() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// startRedis runs redis-server on addr with an append-only file in dir
// (fsync always), so a restart keeps what was acknowledged.
func startRedis(t testing.TB, addr, dir string) *proc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found on PATH: install Debian's redis-server package (apt-get install redis-server; .ci/run does)")
	}
	_, port, _ := net.SplitHostPort(addr)
	p := startProc(t, "redis-server", bin, []string{"--port", port, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", dir}, nil)
	awaitRedis(t, addr, p)
	return p
}

func awaitRedis(t testing.TB, addr string, p *proc) {
	t.Helper()
	ok := waitFor(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		io.WriteString(c, "PING\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return strings.HasPrefix(line, "+PONG")
	})
	if !ok {
		t.Fatalf("redis-server on %s did not answer PING within 10s:\n%s", addr, p.out)
	}
}

// awaitHTTP waits until url answers 200.
func awaitHTTP(t testing.TB, url string, p *proc) {
	t.Helper()
	ok := waitFor(20*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ok {
		t.Fatalf("%s not ready within 20s:\n%s", url, p.out)
	}
}

// awaitListening waits until addr accepts TCP connections (the dev proxy
// listens only once its VMs have started).
func awaitListening(t testing.TB, addr string, p *proc) {
	t.Helper()
	ok := waitFor(60*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if !ok {
		t.Fatalf("%s not listening within 60s:\n%s", addr, p.out)
	}
}
