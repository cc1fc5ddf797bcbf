package quota

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// hmgets returns how many HMGET commands the Redis at addr has run.
func hmgets(t *testing.T, addr string) int {
	t.Helper()
	out, err := redisproc.Command(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_hmget:calls="); ok {
			n := 0
			for _, c := range rest {
				if c < '0' || c > '9' {
					break
				}
				n = n*10 + int(c-'0')
			}
			return n
		}
	}
	return 0
}

// TestAKeyNoOneElseWritesIsDecidedWithoutReadingIt: ten rounds of one
// Envoy on one key read the key twice (the first round, and the one that
// finds it as this service left it); a second service's write in between
// makes the first service's next round conflict, read the key and decide on
// what the other wrote: the two services' grants never exceed the window's
// limit of 1,000.
func TestAKeyNoOneElseWritesIsDecidedWithoutReadingIt(t *testing.T) {
	rs := redisproc.Start(t)
	clk := &clock{}
	clk.set(base())
	pol := newPolicies(t)
	s1 := newService(t, NewRedis(redisClient(rs.Addr())), pol, clk)
	s2 := newService(t, NewRedis(redisClient(rs.Addr())), pol, clk)
	a, b := &envoy{name: "a"}, &envoy{name: "b"}
	key := globalKey("fw")
	before := hmgets(t, rs.Addr())
	var granted uint64
	for range 10 {
		granted += ask(t, s1, a, "fw", key, 0, 0, 10).Granted
	}
	if got := hmgets(t, rs.Addr()) - before; got != 2 {
		t.Errorf("ten rounds of one service read the key %d times, want 2", got)
	}
	granted += ask(t, s2, b, "fw", key, 0, 0, 1000).Granted
	before = hmgets(t, rs.Addr())
	for range 50 {
		granted += ask(t, s1, a, "fw", key, 0, 0, 1000).Granted
	}
	if granted != 1000 {
		t.Errorf("granted %d in the window, want exactly its limit of 1,000", granted)
	}
	if got := hmgets(t, rs.Addr()) - before; got < 1 {
		t.Errorf("the round after another service's write read the key %d times, want at least 1", got)
	}
}
