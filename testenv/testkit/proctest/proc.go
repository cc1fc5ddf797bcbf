package proctest

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Spec says how to run a child process.
type Spec struct {
	Name string   // for messages, e.g. "control plane"
	Bin  string   // path of the executable
	Args []string // arguments after the program name
	Env  []string // "KEY=value" entries added to the test's environment
	Dir  string   // working directory; "" is the test's own
}

// Proc is a child process the test can kill and start again with the same
// Spec. Its stdout and stderr go to one SyncBuffer, kept across restarts.
type Proc struct {
	t    testing.TB
	spec Spec
	cmd  *exec.Cmd // nil while not running
	out  *SyncBuffer
}

// Start runs spec as a child process in a process group of its own. When
// the test ends the process is killed, and if the test failed its output
// is logged. Start fails the test if the process cannot be started.
func Start(t testing.TB, spec Spec) *Proc {
	t.Helper()
	p := &Proc{t: t, spec: spec, out: &SyncBuffer{}}
	p.Start()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", spec.Name, p.out)
		}
	})
	return p
}

// Start starts the process again after Kill, with the same Spec and
// output buffer. It fails the test if the process is running or cannot
// be started.
func (p *Proc) Start() {
	p.t.Helper()
	if p.cmd != nil {
		p.t.Fatalf("proctest: starting %s: already running as pid %d", p.spec.Name, p.cmd.Process.Pid)
	}
	cmd := exec.Command(p.spec.Bin, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Dir = p.spec.Dir
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting %s: %v", p.spec.Name, err)
	}
	p.cmd = cmd
}

// Kill stops the process and its process group with SIGKILL (an outage,
// not a shutdown) and waits for it to exit. Killing a process that is not
// running does nothing.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// CPUTime returns the user and system CPU time the running process has used,
// read from /proc/PID/stat (Linux; clock ticks of 10 ms, as proc(5) gives
// them with USER_HZ 100). It fails the test if the process is not running or
// the file cannot be read.
func (p *Proc) CPUTime() time.Duration {
	p.t.Helper()
	if p.cmd == nil {
		p.t.Fatalf("proctest: CPU time of %s: not running", p.spec.Name)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		p.t.Fatalf("proctest: CPU time of %s: %v", p.spec.Name, err)
	}
	// Fields after the command name (which may hold spaces) in parentheses:
	// state is field 3, utime 14 and stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		p.t.Fatalf("proctest: CPU time of %s: short stat %q", p.spec.Name, b)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		p.t.Fatalf("proctest: CPU time of %s: stat %q", p.spec.Name, b)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// Output returns what the process has written to stdout and stderr so
// far, over all its runs.
func (p *Proc) Output() string { return p.out.String() }

// AwaitHTTP waits up to limit (wall time) until a GET of url answers 200
// OK; otherwise it fails the test, quoting p's output.
func AwaitHTTP(t testing.TB, url string, limit time.Duration, p *Proc) {
	t.Helper()
	ok := WaitFor(limit, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ok {
		t.Fatalf("%s not ready within %s:\n%s", url, limit, p.out)
	}
}

// AwaitListening waits up to limit (wall time) until addr (host:port)
// accepts TCP connections; otherwise it fails the test, quoting p's
// output.
func AwaitListening(t testing.TB, addr string, limit time.Duration, p *Proc) {
	t.Helper()
	ok := WaitFor(limit, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if !ok {
		t.Fatalf("%s not listening within %s:\n%s", addr, limit, p.out)
	}
}
