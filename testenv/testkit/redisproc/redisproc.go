// Package redisproc starts real Redis servers for tests: a single redis-server,
// which a test may Kill and Restart on the same port, and a three-master Redis
// Cluster. Every process listens on a free loopback port, keeps its files in the
// test's temporary directory, persists nothing (--save "" --appendonly no) and is
// killed when the test ends. A missing redis-server or redis-cli fails the test
// (nothing is skipped).
package redisproc

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binary finds a Redis program ("redis-server" or "redis-cli"): the environment
// variable SLUICE_REDIS_SERVER (or SLUICE_REDIS_CLI), then PATH, then /usr/bin. It
// returns "" when there is none.
func Binary(name string) string {
	env := "SLUICE_REDIS_SERVER"
	if name == "redis-cli" {
		env = "SLUICE_REDIS_CLI"
	}
	if p := os.Getenv(env); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/" + name); err == nil {
		return "/usr/bin/" + name
	}
	return ""
}

func need(t testing.TB, name string) string {
	t.Helper()
	p := Binary(name)
	if p == "" {
		t.Fatalf("redisproc: %s not found (install the Debian package redis-server, which brings redis-server and redis-cli)", name)
	}
	return p
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redisproc: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Server is one redis-server process owned by a test.
type Server struct {
	t     testing.TB
	bin   string
	dir   string
	port  int
	unix  bool
	extra []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Options configure Start.
type Options struct {
	// AppendOnly turns on the append-only file with an fsync on every write
	// (--appendonly yes --appendfsync always), so that Restart keeps every
	// acknowledged write. Off by default: nothing is persisted.
	AppendOnly bool
	// Port is the loopback port to listen on; 0 picks a free one.
	Port int
	// Dir holds the server's files (its log, and the append-only file with
	// AppendOnly); "" is a new directory of the test's.
	Dir string
	// UnixSocket also listens on a Unix socket in Dir (Socket), mode 0700.
	UnixSocket bool
}

// Start starts a standalone redis-server on 127.0.0.1 for t, waits until it
// answers PING, and registers its cleanup. It fails the test when redis-server
// is missing or does not start.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	s := &Server{t: t, bin: need(t, "redis-server")}
	for _, o := range opts {
		if o.AppendOnly {
			s.extra = append(s.extra, "--appendonly", "yes", "--appendfsync", "always")
		}
		s.port, s.dir, s.unix = o.Port, o.Dir, o.UnixSocket
	}
	if s.port == 0 {
		s.port = freePort(t)
	}
	if s.dir == "" {
		s.dir = t.TempDir()
	}
	if s.unix {
		s.extra = append(s.extra, "--unixsocket", s.Socket(), "--unixsocketperm", "700")
	}
	t.Cleanup(s.Kill)
	s.start()
	return s
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL returns "redis://127.0.0.1:port".
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Socket returns the path of the server's Unix socket (Options.UnixSocket).
func (s *Server) Socket() string { return filepath.Join(s.dir, "redis.sock") }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

func (s *Server) start() {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
		"--appendfilename", "appendonly-" + strconv.Itoa(s.port) + ".aof",
		"--loglevel", "warning", "--logfile", filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log"),
	}, s.extra...)
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redisproc: start %s: %v", s.bin, err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := Command(s.Addr(), "PING")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log"))
			s.t.Fatalf("redisproc: redis-server on %s not answering PING after 15s: %v\n%s", s.Addr(), err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL and waits for it; a no-op when it is not running.
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

// Signal sends sig to the server: syscall.SIGSTOP freezes it (clients' calls
// hang until their timeouts), syscall.SIGCONT resumes it. An error when it is not
// running.
func (s *Server) Signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redisproc: " + s.Addr() + " is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port: empty, unless it was started
// with Options.AppendOnly.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// Cluster is a three-master Redis Cluster (no replicas) owned by a test.
type Cluster struct {
	// Nodes are the three masters.
	Nodes []*Server
}

// StartCluster starts three redis-server nodes with --cluster-enabled yes, joins
// them with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`
// and waits until every node's CLUSTER INFO says cluster_state:ok.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli := need(t, "redis-cli")
	bin := need(t, "redis-server")
	dir := t.TempDir()
	c := &Cluster{}
	for i := 0; i < 3; i++ {
		port := freePort(t)
		s := &Server{t: t, bin: bin, dir: dir, port: port, extra: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf"),
			"--cluster-node-timeout", "5000",
		}}
		t.Cleanup(s.Kill)
		s.start()
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redisproc: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		for {
			info, err := Command(n.Addr(), "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redisproc: cluster node %s not ok after 30s: %v\n%s", n.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr()
	}
	return a
}

// Owner returns the master serving key's slot: the slot from CLUSTER KEYSLOT, its
// owner from the slot ranges CLUSTER NODES lists.
func (c *Cluster) Owner(key string) (*Server, error) {
	slotS, err := Command(c.Nodes[0].Addr(), "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, err
	}
	slot, err := strconv.Atoi(slotS)
	if err != nil {
		return nil, errors.New("redisproc: CLUSTER KEYSLOT: " + slotS)
	}
	nodes, err := Command(c.Nodes[0].Addr(), "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || slot < l || slot > h {
				continue
			}
			for _, n := range c.Nodes {
				if n.Addr() == addr {
					return n, nil
				}
			}
		}
	}
	return nil, errors.New("redisproc: no node owns slot " + slotS)
}

// CommandCalls returns how many times the Redis at addr has run each command
// since it started, by lower-case name ("hmget", "evalsha"), as INFO
// commandstats counts them: a script's inner commands included, and this
// INFO itself.
// https://redis.io/docs/latest/commands/info/ ("commandstats").
func CommandCalls(addr string) (map[string]uint64, error) {
	out, err := Command(addr, "INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	calls := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			return nil, errors.New("redisproc: INFO commandstats: " + line)
		}
		calls[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return calls, nil
}

// Command sends one command in RESP to addr and returns its reply as text: a
// simple or bulk string as is, an integer in decimal, an array as its elements
// joined by newlines; an error reply is returned as an error.
func Command(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("redisproc: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", errors.New("redisproc: unexpected reply " + line)
}
