package quota

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// singleBackends are the memory backend and one real redis-server.
var singleBackends = backends[:2]

// storageKey returns the backend key of counter key under rule of the test policy.
func storageKey(t testing.TB, s *Service, p *policies, rule, key string) string {
	t.Helper()
	c, err := s.compile(mustRecord(t, p), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	return c.pfx[c.byID[rule]] + key
}

// TestFullLedgerKeepsTheKeysState: an Envoy refused because the key's ledger is full
// (MaxEnvoysPerKey Envoys hold leases) must leave the key's stored value as it was,
// with its expiry: the units the others hold stay counted.
func TestFullLedgerKeepsTheKeysState(t *testing.T) {
	for _, bk := range singleBackends {
		t.Run(bk.name, func(t *testing.T) {
			b, _, client, _ := bk.open(t)
			clk := &clock{}
			clk.set(base() + int64(time.Second))
			p := newPolicies(t)
			s := newService(t, b, p, clk)
			key := globalKey("fw")
			es := newEnvoys(MaxEnvoysPerKey + 1)
			var total uint64
			for _, e := range es[:MaxEnvoysPerKey] {
				total += ask(t, s, e, "fw", key, 0, 0, 1).Granted
			}
			if total != MaxEnvoysPerKey {
				t.Fatalf("%d Envoys asking 1 unit each got %d", MaxEnvoysPerKey, total)
			}
			if r := ask(t, s, es[MaxEnvoysPerKey], "fw", key, 0, 0, 1); r.Status != quota.StatusRefused || r.Granted != 0 {
				t.Fatalf("Envoy %d on a full ledger: %+v", MaxEnvoysPerKey+1, r)
			}
			skey := storageKey(t, s, p, "fw", key)
			if client != nil {
				if ttl := client.PTTL(context.Background(), skey).Val(); ttl < ttlSlack/2 {
					t.Fatalf("after the refusal the key expires in %v", ttl)
				}
			} else {
				m := b.(*Memory)
				m.Now = func() time.Time { return time.Now().Add(time.Second) }
				vals, _ := m.Load(context.Background(), []string{skey})
				m.Now = nil
				if vals[0] == nil {
					t.Fatal("after the refusal the key's value is gone")
				}
			}
			for i := 0; i < 100; i++ {
				total += ask(t, s, es[0], "fw", key, 0, 0, 1000).Granted
			}
			if total > 1000 {
				t.Fatalf("%d units granted in one window, limit 1000", total)
			}
		})
	}
}
