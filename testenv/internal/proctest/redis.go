package proctest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ErrNoRedis is returned by LookRedis when redis-server is not on PATH;
// its message names the Debian package that provides it.
var ErrNoRedis = errors.New("proctest: redis-server not found on PATH: install Debian's redis-server package (apt-get install redis-server; .ci/run does)")

// RedisReadyTimeout is how long StartRedis and AwaitRedis wait for
// redis-server to answer PING: 10 seconds.
const RedisReadyTimeout = 10 * time.Second

// LookRedis returns the path of redis-server on PATH, or ErrNoRedis.
func LookRedis() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrNoRedis
	}
	return bin, nil
}

// StartRedis runs the redis-server at bin (see LookRedis) on addr, a free
// loopback "127.0.0.1:port" (see FreeAddr), with its files in dir, RDB
// snapshots off and the further configuration args (for example
// "--appendonly", "no"). It waits until the server answers PING (see
// AwaitRedis); the server is killed when the test ends.
func StartRedis(t testing.TB, bin, addr, dir string, args ...string) *Proc {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("proctest: redis-server address %q: %v", addr, err)
	}
	p := Start(t, Spec{
		Name: "redis-server",
		Bin:  bin,
		Args: append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir}, args...),
	})
	AwaitRedis(t, addr, p)
	return p
}

// AwaitRedis waits up to RedisReadyTimeout until the redis-server p on
// addr answers PING with PONG (each try bounded by one second); otherwise
// it fails the test, quoting p's output.
func AwaitRedis(t testing.TB, addr string, p *Proc) {
	t.Helper()
	ok := WaitFor(RedisReadyTimeout, func() bool {
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
		t.Fatalf("redis-server on %s did not answer PING within %s:\n%s", addr, RedisReadyTimeout, p.out)
	}
}
