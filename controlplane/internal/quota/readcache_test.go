package quota

import (
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

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
	before := calls(t, rs.Addr(), "hmget")
	var granted uint64
	for range 10 {
		granted += ask(t, s1, a, "fw", key, 0, 0, 10).Granted
	}
	if got := calls(t, rs.Addr(), "hmget") - before; got != 2 {
		t.Errorf("ten rounds of one service read the key %d times, want 2", got)
	}
	granted += ask(t, s2, b, "fw", key, 0, 0, 1000).Granted
	before = calls(t, rs.Addr(), "hmget")
	for range 50 {
		granted += ask(t, s1, a, "fw", key, 0, 0, 1000).Granted
	}
	if granted != 1000 {
		t.Errorf("granted %d in the window, want exactly its limit of 1,000", granted)
	}
	if got := calls(t, rs.Addr(), "hmget") - before; got < 1 {
		t.Errorf("the round after another service's write read the key %d times, want at least 1", got)
	}
}
