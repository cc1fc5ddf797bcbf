package quota

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// calls returns how many times the Redis at addr has run cmd
// (redisproc.CommandCalls).
func calls(t testing.TB, addr, cmd string) int {
	t.Helper()
	c, err := redisproc.CommandCalls(addr)
	if err != nil {
		t.Fatal(err)
	}
	return int(c[cmd])
}

// TestAKeyAlwaysOutlivesItsLedgerThoughMostRoundsSetNoExpiry: an Envoy asks
// on one key every 700 ms of the service's clock over three minutes of fixed
// windows and token bucket refills. After every round the key's expiry, as
// the rounds that set it left it (the service's time of that round plus the
// TTL Redis then reported: the clock is injected, and Redis's own runs far
// slower), is at least ttlSlack past the moment its stored value becomes
// equivalent to an absent one (until); and most rounds leave the expiry as
// it was (no PEXPIRE).
func TestAKeyAlwaysOutlivesItsLedgerThoughMostRoundsSetNoExpiry(t *testing.T) {
	rs := redisproc.Start(t)
	client := redisClient(rs.Addr())
	clk := &clock{}
	clk.set(base())
	pol := newPolicies(t)
	s := newService(t, NewRedis(client), pol, clk)
	c, err := s.compile(mustRecord(t, pol), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range []string{"fw", "tb"} {
		t.Run(rule, func(t *testing.T) {
			f := c.fleet[c.byID[rule]]
			e := &envoy{name: "a"}
			key := globalKey(rule)
			skey := storageKey(t, s, pol, rule, key)
			pexpires, set := calls(t, rs.Addr(), "pexpire"), 0
			var expiresAt int64 // service clock, Unix ns
			const rounds = 260
			for i := range rounds {
				clk.add(700 * time.Millisecond)
				if r := ask(t, s, e, rule, key, uint64(i%3), 0, 5); r.Status == "" || r.Status == quota.StatusRetry {
					t.Fatalf("round %d: %+v", i, r)
				}
				if n := calls(t, rs.Addr(), "pexpire"); n > pexpires {
					pexpires, set = n, set+1
					expiresAt = clk.Now() + int64(client.PTTL(context.Background(), skey).Val())
				}
				raw, err := client.HGet(context.Background(), skey, headerField).Bytes()
				if err != nil {
					t.Fatalf("round %d: the key's header: %v", i, err)
				}
				h, err := f.load(raw)
				if err != nil {
					t.Fatal(err)
				}
				if until := f.until(&h, h.latest); expiresAt < until+int64(ttlSlack) {
					t.Fatalf("round %d: the key expires %v after now, its value is live for %v more",
						i, time.Duration(expiresAt-clk.Now()), time.Duration(until-clk.Now()))
				}
			}
			if set < 2 || set > rounds/4 {
				t.Errorf("%d of %d rounds set the key's expiry, want between 2 and a quarter", set, rounds)
			}
		})
	}
}
