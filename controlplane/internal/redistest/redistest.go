// Package redistest starts a private redis-server for tests: on a free
// loopback port, in a temporary directory, killed when the test ends. Tests
// may Kill and Restart it (on the same port and directory) to exercise
// outages. It never touches a system Redis.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure a Server.
type Options struct {
	// AppendOnly turns on the append-only file with fsync on every write
	// (--appendonly yes --appendfsync always), so a restart keeps every
	// acknowledged write. Off by default: no persistence at all.
	AppendOnly bool
}

// Server is a redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	opts Options

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Binary finds redis-server: $SLUICE_REDIS_SERVER, then PATH, then
// /usr/bin/redis-server. It returns "" when there is none.
func Binary() string {
	if p := os.Getenv("SLUICE_REDIS_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server"
	}
	return ""
}

// Start starts a redis-server for t and registers its cleanup. It fails the
// test, naming the Debian package, when the binary is missing.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Fatal("redistest: redis-server not found (install the Debian package redis-server, or set SLUICE_REDIS_SERVER)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: find a free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{t: t, bin: bin, dir: t.TempDir(), port: port, opts: opts}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// Addr returns host:port of the server.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL returns the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

func (s *Server) start() {
	s.t.Helper()
	args := []string{
		"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "yes",
		"--loglevel", "warning", "--logfile", filepath.Join(s.dir, "redis.log"),
	}
	if s.opts.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start %s: %v", s.bin, err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr()); err == nil {
			return
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redistest: redis-server on %s not answering PING after 10s: %v\n%s", s.Addr(), err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server abruptly (SIGKILL) and waits for it to exit. It is a
// no-op when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart starts the server again on the same port and directory (with
// AppendOnly, the data written before Kill is loaded back).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}
