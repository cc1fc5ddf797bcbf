package quota

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// testPolicyDoc has one fleet rule per fleet-capable algorithm, all with limit 1000
// per minute, plus an Envoy-scoped rule and a keyed fleet rule.
const testPolicyDoc = `{"policy":"p","version":1,"rules":[
 {"id":"fw","algorithm":"fixed_window","limit":1000,"window":"1m","scope":"fleet"},
 {"id":"tb","algorithm":"token_bucket","limit":1000,"window":"1m","scope":"fleet"},
 {"id":"gc","algorithm":"gcra","limit":1000,"burst":100,"window":"1m","scope":"fleet"},
 {"id":"tw","algorithm":"time_wheel","limit":1000,"window":"1m","slots":10,"scope":"fleet"},
 {"id":"local","algorithm":"fixed_window","limit":1000,"window":"1m"},
 {"id":"keyed","key":["client_ip"],"algorithm":"fixed_window","limit":1000,"window":"1m","scope":"fleet"}]}`

const testEnv = "t"

func globalKey(rule string) string {
	return "rl:" + testEnv + ":p/" + rule + ":*:60s"
}

// policies is a fixed set of policy records.
type policies struct {
	mu sync.Mutex
	m  map[string]store.Record
}

func (p *policies) Get(name string) (store.Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[name]
	return r, ok
}

func (p *policies) set(t testing.TB, doc string) {
	t.Helper()
	pol, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[pol.Name] = store.Record{Name: pol.Name, Version: pol.Version, Doc: rules.EncodePolicy(pol)}
}

func newPolicies(t testing.TB) *policies {
	p := &policies{m: map[string]store.Record{}}
	p.set(t, testPolicyDoc)
	return p
}

// clock is the test's time, Unix ns, moved only by the test.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() int64          { return c.ns.Load() }
func (c *clock) set(ns int64)        { c.ns.Store(ns) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// base is a minute boundary: windows are aligned to the Unix epoch.
func base() int64 {
	m := int64(time.Minute)
	return time.Now().UnixNano()/m*m + m
}

// backendKind names a Backend under test and builds it.
type backendKind struct {
	name string
	// open returns a fresh Backend, a second independent Backend over the same store
	// (a second replica), and, for Redis, a client to inspect it.
	open func(t *testing.T) (Backend, Backend, redis.UniversalClient, *redisproc.Cluster)
}

func redisClient(addrs ...string) redis.UniversalClient {
	o := &redis.UniversalOptions{Addrs: addrs, IsClusterMode: len(addrs) > 1}
	TuneClient(o)
	return redis.NewUniversalClient(o)
}

var backends = []backendKind{
	{"memory", func(t *testing.T) (Backend, Backend, redis.UniversalClient, *redisproc.Cluster) {
		m := NewMemory()
		return m, m, nil, nil
	}},
	{"redis", func(t *testing.T) (Backend, Backend, redis.UniversalClient, *redisproc.Cluster) {
		s := redisproc.Start(t)
		c1, c2 := redisClient(s.Addr()), redisClient(s.Addr())
		t.Cleanup(func() { c1.Close(); c2.Close() })
		return NewRedis(c1), NewRedis(c2), c1, nil
	}},
	{"cluster", func(t *testing.T) (Backend, Backend, redis.UniversalClient, *redisproc.Cluster) {
		cl := redisproc.StartCluster(t)
		c1, c2 := redisClient(cl.Addrs()...), redisClient(cl.Addrs()...)
		t.Cleanup(func() { c1.Close(); c2.Close() })
		return NewRedis(c1), NewRedis(c2), c1, cl
	}},
}

func newService(t testing.TB, b Backend, p Policies, clk *clock) *Service {
	return New(Options{Backend: b, Policies: p, Open: true, Now: clk.Now, Timeout: 2 * time.Second})
}

// grant is one answer seen by a simulated Envoy.
type grant struct {
	at       int64
	envoy    int
	granted  uint64
	returned uint64
	held     uint64
	exp      int64
}

// envoy is a simulated Envoy's lease of one key, as the filter would keep it.
type envoy struct {
	id   int
	name string
	held uint64
	exp  int64
	rng  *rand.Rand
	log  []grant
}

func ask(t testing.TB, s *Service, e *envoy, rule, key string, used, ret, want uint64) quota.KeyResult {
	t.Helper()
	resp, err := s.Handle(context.Background(), &quota.Request{Envoy: e.name, Policy: "p", Version: 1, Env: testEnv,
		Interval: time.Second, Keys: []quota.KeyRequest{{Rule: rule, Key: key, Used: used, Return: ret, Want: want}}})
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	r := resp.Keys[0]
	e.log = append(e.log, grant{at: resp.Now, envoy: e.id, granted: r.Granted, returned: r.Returned, held: r.Held, exp: resp.Now + int64(r.ExpiresIn)})
	e.held, e.exp = r.Held, resp.Now+int64(r.ExpiresIn)
	return r
}

// simulate runs envoys Envoys against one key for steps steps of step each: at
// every step each Envoy, concurrently, asks three times for a random amount, and now
// and then returns part of its lease. It returns every answer.
func simulate(t *testing.T, svcs []*Service, clk *clock, rule string, start int64, steps int, step time.Duration, envoys int) []grant {
	key := globalKey(rule)
	es := make([]*envoy, envoys)
	for i := range es {
		es[i] = &envoy{id: i, name: "envoy-" + string(rune('a'+i)), rng: rand.New(rand.NewPCG(uint64(i), 7))}
	}
	for st := 0; st < steps; st++ {
		clk.set(start + int64(st)*int64(step))
		var wg sync.WaitGroup
		for _, e := range es {
			wg.Add(1)
			go func(e *envoy) {
				defer wg.Done()
				s := svcs[e.id%len(svcs)]
				for r := 0; r < 3; r++ {
					var ret uint64
					if e.held > 0 && e.rng.IntN(4) == 0 {
						ret = uint64(e.rng.IntN(int(e.held) + 1))
					}
					ask(t, s, e, rule, key, uint64(e.rng.IntN(100)), ret, uint64(10+e.rng.IntN(200)))
				}
			}(e)
		}
		wg.Wait()
	}
	var all []grant
	for _, e := range es {
		all = append(all, e.log...)
	}
	return all
}
