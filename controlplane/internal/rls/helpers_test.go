package rls

import (
	"context"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/rlqs"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/promtest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// policies is a snapshot's view the test sets.
type policies struct {
	mu  sync.Mutex
	m   map[string]store.Record
	gen atomic.Uint64
}

func (p *policies) Get(name string) (store.Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[name]
	return r, ok
}

func (p *policies) List() []store.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []store.Record
	for _, r := range p.m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name }) // as snapshot.List
	return out
}

func (p *policies) Generation() uint64 { return p.gen.Load() }

func (p *policies) set(t testing.TB, doc string) {
	t.Helper()
	pol, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]store.Record{}
	}
	pol.Version = p.m[pol.Name].Version + 1
	p.m[pol.Name] = store.Record{Name: pol.Name, Version: pol.Version, Doc: rules.EncodePolicy(pol)}
	p.gen.Add(1)
}

// clock is a test clock shared by the replicas.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() int64              { return c.ns.Load() }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// replica is one control plane's rate limit service over loopback gRPC.
type replica struct {
	srv    *Server
	reg    *prometheus.Registry
	client rlsv3.RateLimitServiceClient
	// kill stops the replica as SIGKILL would for the ledger: its sweep and
	// its listener end, and nothing it holds is reported or returned.
	kill func()
}

type fixture struct {
	redis *redisproc.Server
	pol   *policies
	clk   *clock
}

// newFixture starts a redis-server and sets doc as the policies; the clock
// starts at the beginning of a minute.
func newFixture(t testing.TB, doc string) *fixture {
	f := &fixture{redis: redisproc.Start(t), pol: &policies{}, clk: &clock{}}
	m := int64(time.Minute)
	f.clk.ns.Store(time.Now().UnixNano()/m*m + m)
	f.pol.set(t, doc)
	return f
}

// replica starts a replica with a quota service of its own on the fixture's
// Redis, as a control plane process has.
func (f *fixture) replica(t testing.TB, name string, token string, opts ...func(*Options)) *replica {
	t.Helper()
	o := &redis.UniversalOptions{Addrs: []string{f.redis.Addr()}}
	quota.TuneClient(o)
	rc := redis.NewUniversalClient(o)
	t.Cleanup(func() { rc.Close() })
	reg := prometheus.NewRegistry()
	var now func() int64 // the real clock without a test clock
	if f.clk != nil {
		now = f.clk.now
	}
	q := quota.New(quota.Options{Backend: quota.NewRedis(rc), Policies: f.pol, Open: token == "", Token: token,
		Now: now, Registry: reg})
	so := Options{Quota: q, Policies: f.pol, Replica: name, Recalls: RedisRecalls{Client: rc}, Now: now, Registry: reg}
	for _, set := range opts {
		set(&so)
	}
	srv := New(so)
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx)
	t.Cleanup(cancel)
	g := rlqs.NewGRPCServer(rlqs.New(rlqs.Options{Quota: q}), nil, srv.Register)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(l)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	kill := func() { cancel(); g.Stop() }
	return &replica{srv: srv, reg: reg, client: rlsv3.NewRateLimitServiceClient(conn), kill: kill}
}

// desc is a descriptor of entries given as key, value, key, value, ...
func desc(kv ...string) *commonrl.RateLimitDescriptor {
	d := &commonrl.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (r *replica) call(t testing.TB, domain string, ds ...*commonrl.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// counterWith is promtest.Counter.
func counterWith(_ testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	return promtest.Counter(reg, name, label, value)
}
