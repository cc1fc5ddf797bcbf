package quota

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// hotPolicyDoc has one fleet key whose budget many Envoys share and never spend.
const hotPolicyDoc = `{"policy":"h","version":1,"rules":[
 {"id":"hot","algorithm":"fixed_window","limit":100000000,"window":"1m","scope":"fleet"}]}`

const hotKey = "rl:" + testEnv + ":h/hot:*:60s"

// consumed returns the units the fixed_window key hotKey of policy h has counted at
// clock clk, read from the backend itself.
func consumed(t *testing.T, s *Service, b Backend, p *policies, clk *clock) uint64 {
	t.Helper()
	rec, _ := p.Get("h")
	c, err := s.compile(rec, testEnv)
	if err != nil {
		t.Fatal(err)
	}
	ri := c.byID["hot"]
	skey := c.pfx[ri] + hotKey
	snaps, err := b.Load(context.Background(), []Read{{Key: skey}})
	if err != nil {
		t.Fatal(err)
	}
	f := c.fleet[ri]
	v, err := decodeHeader(snaps[0].Header, f.lim.StateSize())
	if err != nil || v.state == nil {
		t.Fatalf("stored value of %s: %v", skey, err)
	}
	d := f.lim.Decide(v.state, make([]byte, f.lim.StateSize()), clk.Now(), 0)
	return 100000000 - d.Remaining
}

// TestHotKeyIsQueuedNotRefused: 128 Envoys asking for one key at once through two
// replicas on one real Redis are all answered from the budget, which is far from
// spent: no key is refused, no request fails, and what the answers granted is
// exactly what the store counted.
func TestHotKeyIsQueuedNotRefused(t *testing.T) {
	rs := redisproc.Start(t)
	c1, c2 := redisClient(rs.Addr()), redisClient(rs.Addr())
	t.Cleanup(func() { c1.Close(); c2.Close() })
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	p.set(t, hotPolicyDoc)
	b1, b2 := NewRedis(c1), NewRedis(c2)
	svcs := []*Service{newService(t, b1, p, clk), newService(t, b2, p, clk)}

	const envoys, asks = 128, 20
	var mu sync.Mutex
	statuses := map[string]int{}
	var granted uint64
	var failed []error
	var wg sync.WaitGroup
	for i := 0; i < envoys; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var held uint64
			for n := 0; n < asks; n++ {
				resp, err := svcs[(i+n)%2].Handle(context.Background(), &quota.Request{Envoy: "envoy-" + strconv.Itoa(i), Policy: "h", Version: 1,
					Env: testEnv, Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "hot", Key: hotKey, Used: held, Want: 5}}})
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
					mu.Unlock()
					return
				}
				r := resp.Keys[0]
				statuses[r.Status]++
				granted += r.Granted
				mu.Unlock()
				held = r.Granted // spent before the next ask, as an Envoy reports it
			}
		}(i)
	}
	wg.Wait()
	t.Logf("answers by status: %v; granted %d units", statuses, granted)
	if len(failed) > 0 {
		t.Fatalf("%d requests failed, first: %v", len(failed), failed[0])
	}
	if statuses[quota.StatusRefused] > 0 {
		t.Errorf("%d answers refused a key whose budget (10^8) was far from spent", statuses[quota.StatusRefused])
	}
	if got := consumed(t, svcs[0], b1, p, clk); got != granted {
		t.Errorf("the store counted %d units, the answers granted %d", got, granted)
	}
}

// conflicting is a Backend whose swaps of one key always lose, as if other replicas
// always wrote it first.
type conflicting struct {
	Backend
	lose string // substring of the key whose swaps never apply
}

func (c *conflicting) Swap(ctx context.Context, ops []Op) ([]bool, error) {
	var keep []Op
	var idx []int
	for i, op := range ops {
		if !bytes.Contains([]byte(op.Key), []byte(c.lose)) {
			keep = append(keep, op)
			idx = append(idx, i)
		}
	}
	out := make([]bool, len(ops))
	if len(keep) > 0 {
		got, err := c.Backend.Swap(ctx, keep)
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = got[j]
		}
	}
	return out, nil
}

// TestKeyContendedPastTheDeadlineAnswersRetry: a key whose compare-and-swap never
// wins before the timeout is answered retry (nothing granted), while the other key
// of the same request is decided; the request is not an outage.
func TestKeyContendedPastTheDeadlineAnswersRetry(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	mem := NewMemory()
	s := New(Options{Backend: &conflicting{Backend: mem, lose: "ip=10.0.0.1:"}, Policies: p, Open: true, Now: clk.Now, Timeout: 50 * time.Millisecond})
	resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "e", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
		Keys: []quota.KeyRequest{
			{Rule: "keyed", Key: "rl:t:p/keyed:ip=10.0.0.1:60s", Want: 5},
			{Rule: "keyed", Key: "rl:t:p/keyed:ip=10.0.0.2:60s", Want: 5},
		}})
	if err != nil {
		t.Fatalf("Handle: %v (contention is not an outage)", err)
	}
	if r := resp.Keys[0]; r.Status != quota.StatusRetry || r.Granted != 0 || r.RetryAfter <= 0 {
		t.Errorf("contended key: %+v, want retry with nothing granted and a RetryAfter", r)
	}
	if r := resp.Keys[1]; r.Status != quota.StatusGranted || r.Granted != 5 {
		t.Errorf("other key: %+v, want 5 granted", r)
	}
	if mem.Len() != 1 {
		t.Errorf("the store holds %d keys, want only the decided one", mem.Len())
	}
}

// failing is a Backend that cannot answer.
type failing struct{}

var errDown = errors.New("connection refused")

func (failing) Load(context.Context, []Read) ([]Snapshot, error) { return nil, errDown }
func (failing) Swap(context.Context, []Op) ([]bool, error)       { return nil, errDown }

// TestBackendErrorIsAnOutage: an error of the backend itself still fails the whole
// request with ErrUnavailable (answered 503), unlike contention.
func TestBackendErrorIsAnOutage(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	s := New(Options{Backend: failing{}, Policies: newPolicies(t), Open: true, Now: clk.Now})
	_, err := s.Handle(context.Background(), &quota.Request{Envoy: "e", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
		Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 1}}})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errDown) {
		t.Fatalf("Handle: %v, want ErrUnavailable wrapping the backend's error", err)
	}
}

// TestQueuedAskPastItsDeadlineAnswersRetry: an ask queued behind a round that does
// not end before the ask's deadline is answered retry without waiting for it, and
// the round, when it ends, hands the key on.
func TestQueuedAskPastItsDeadlineAnswersRetry(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	gate := &gated{Backend: NewMemory(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := New(Options{Backend: gate, Policies: p, Open: true, Now: clk.Now, Timeout: 20 * time.Millisecond})
	req := func(envoy string) *quota.Request {
		return &quota.Request{Envoy: envoy, Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
			Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 5}}}
	}
	first := make(chan *quota.Response)
	go func() {
		resp, err := s.Handle(context.Background(), req("a"))
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	<-gate.entered // the first request's round is loading, and will not finish
	resp, err := s.Handle(context.Background(), req("b"))
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Keys[0]; r.Status != quota.StatusRetry || r.Granted != 0 {
		t.Errorf("queued ask past its deadline: %+v, want retry", r)
	}
	close(gate.release)
	if r := (<-first).Keys[0]; r.Status != quota.StatusGranted || r.Granted != 5 {
		t.Errorf("the round's own ask: %+v, want granted", r)
	}
	// The key is free again: the next ask leads its own round at once.
	resp, err = s.Handle(context.Background(), req("c"))
	if err != nil || resp.Keys[0].Granted == 0 {
		t.Fatalf("after the round: %+v %v", resp, err)
	}
}

// gated is a Backend whose first Load waits until release is closed; later loads
// do not wait.
type gated struct {
	Backend
	first   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gated) Load(ctx context.Context, keys []Read) ([]Snapshot, error) {
	if g.first.CompareAndSwap(false, true) {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Backend.Load(ctx, keys)
}

// TestRestoredPolicyIsCompiledAfresh: a policy written back as version 1 of a new
// epoch, with another document, is decided with that document's rules, not with
// the rules the service compiled for the old epoch's version 1.
func TestRestoredPolicyIsCompiledAfresh(t *testing.T) {
	p := &policies{m: map[string]store.Record{}}
	put := func(doc, epoch string) {
		pol, err := rules.ParsePolicy([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		d := rules.EncodePolicy(pol)
		p.mu.Lock()
		p.m[pol.Name] = store.Record{Name: pol.Name, Version: pol.Version, Doc: d, Epoch: epoch, Sum: store.Sum(d)}
		p.mu.Unlock()
	}
	clk := &clock{}
	clk.set(base())
	s := New(Options{Backend: NewMemory(), Policies: p, Open: true, Now: clk.Now})
	ask := func() quota.KeyResult {
		resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "e", Policy: "r", Version: 1, Env: testEnv, Interval: time.Second,
			Keys: []quota.KeyRequest{{Rule: "a", Key: "rl:" + testEnv + ":r/a:*:60s", Want: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Keys[0]
	}
	put(`{"policy":"r","version":1,"rules":[{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"}]}`, "e1")
	if r := ask(); r.Status != quota.StatusGranted {
		t.Fatalf("epoch e1: %+v", r)
	}
	put(`{"policy":"r","version":1,"rules":[{"id":"a","algorithm":"fixed_window","limit":10,"window":"1m"}]}`, "e2")
	if r := ask(); r.Status != quota.StatusNotFleet {
		t.Fatalf("epoch e2 made rule a envoy-scoped, the service answered %+v", r)
	}
}

// TestThousandEnvoysShareOneKey: a thousand Envoys reporting on one key every
// interval all keep a ledger entry; none is refused while the budget lasts.
func TestThousandEnvoysShareOneKey(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	p.set(t, hotPolicyDoc)
	s := New(Options{Backend: NewMemory(), Policies: p, Open: true, Now: clk.Now})
	refused := 0
	for round := 0; round < 2; round++ {
		for i := 0; i < 1000; i++ {
			resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "envoy-" + strconv.Itoa(i), Policy: "h", Version: 1,
				Env: testEnv, Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "hot", Key: hotKey, Used: uint64(round), Want: 5}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Keys[0].Status == quota.StatusRefused {
				refused++
			}
		}
		clk.add(time.Second)
	}
	if refused > 0 {
		t.Fatalf("%d of 2000 asks refused on a key whose budget (10^8) was far from spent", refused)
	}
}
