package quota

import (
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// TestConformance runs the same suite against every backend: memory, a real
// redis-server, and a real three-master Redis Cluster.
func TestConformance(t *testing.T) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			b1, b2, client, cluster := bk.open(t)
			t.Run("FourEnvoysFixedWindowNeverExceedLimit", func(t *testing.T) { fourEnvoysWindows(t, b1, "fw") })
			t.Run("FourEnvoysTimeWheelNeverExceedLimit", func(t *testing.T) { fourEnvoysWindows(t, b1, "tw") })
			t.Run("FourEnvoysTokenBucketNeverExceedLimit", func(t *testing.T) { fourEnvoysBuckets(t, b1, "tb") })
			t.Run("FourEnvoysGCRANeverExceedLimit", func(t *testing.T) { fourEnvoysBuckets(t, b1, "gc") })
			t.Run("FixedWindowFillsExactlyToTheLimit", func(t *testing.T) { fillsExactly(t, b1) })
			t.Run("FixedWindowReturnedUnitsAreGrantableAgain", func(t *testing.T) { returnsRegrant(t, b1, "fw", base()+6*int64(time.Hour)) })
			t.Run("TimeWheelReturnedUnitsAreGrantableAgain", func(t *testing.T) { returnsRegrant(t, b1, "tw", base()+14*int64(time.Hour)) })
			t.Run("TokenBucketReturnedUnitsAreGrantableAgain", func(t *testing.T) { bucketReturns(t, b1, "tb", 834, 300, base()+12*int64(time.Hour)) })
			t.Run("GCRAReturnedUnitsAreGrantableAgain", func(t *testing.T) { bucketReturns(t, b1, "gc", 51, 25, base()+15*int64(time.Hour)) })
			t.Run("FixedWindowExpiredGrantsAreNotCountedTwice", func(t *testing.T) { expiredNotTwice(t, b1, "fw", base()+7*int64(time.Hour)) })
			t.Run("TimeWheelExpiredGrantsAreNotCountedTwice", func(t *testing.T) { expiredNotTwice(t, b1, "tw", base()+16*int64(time.Hour)) })
			t.Run("TwoReplicasShareOneBudget", func(t *testing.T) { twoReplicas(t, b1, b2) })
			t.Run("AnswersPerKeyStatus", func(t *testing.T) { perKeyStatus(t, b1) })
			t.Run("ASwapSetsAndDeletesManyFieldsAtOnce", func(t *testing.T) { swapManyFields(t, b1) })
			t.Run("ConcurrentSwapsEachCompareAndSwapTheirOwnKey", func(t *testing.T) { concurrentSwaps(t, b1, client) })
			if cluster != nil {
				t.Run("StateLandsOnTheSlotOwner", func(t *testing.T) { slotOwner(t, b1, client, cluster) })
			}
		})
	}
}

func fourEnvoysWindows(t *testing.T, b Backend, rule string) {
	clk := &clock{}
	s := newService(t, b, newPolicies(t), clk)
	start := base() + int64(time.Hour) // fresh keys: later than any other subtest
	if rule == "tw" {
		start += int64(time.Hour)
	}
	gs := simulate(t, []*Service{s}, clk, rule, start, 100, 1500*time.Millisecond, 4)
	w := int64(time.Minute)
	var net map[int64]int64
	var bucket func(at int64) int64
	var end func(b int64) int64
	if rule == "fw" {
		bucket = func(at int64) int64 { return at / w }
		end = func(b int64) int64 { return (b + 1) * w }
	} else {
		slot := w / 10
		bucket = func(at int64) int64 { return at / slot }
		end = func(b int64) int64 { return (b + 1) * slot }
	}
	net = map[int64]int64{}
	var granted uint64
	for _, g := range gs {
		k := bucket(g.at)
		net[k] += int64(g.granted) - int64(g.returned)
		granted += g.granted
		if g.granted > 0 && g.exp > end(k) {
			t.Fatalf("grant at %d expires at %d, after the end %d of its window/slot", g.at, g.exp, end(k))
		}
	}
	keys := make([]int64, 0, len(net))
	for k := range net {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	span := int64(1)
	if rule == "tw" {
		span = 10
	}
	for _, k := range keys {
		var sum int64
		for j := k - span + 1; j <= k; j++ {
			sum += net[j]
		}
		if sum > 1000 {
			t.Fatalf("%s: %d units granted (net of returns) in the window ending with %d, limit 1000", rule, sum, k)
		}
	}
	if granted < 1000 {
		t.Fatalf("%s: only %d units granted over %d windows", rule, granted, len(keys))
	}
}

func fourEnvoysBuckets(t *testing.T, b Backend, rule string) {
	clk := &clock{}
	s := newService(t, b, newPolicies(t), clk)
	start := base() + 3*int64(time.Hour)
	if rule == "gc" {
		start += int64(time.Hour)
	}
	gs := simulate(t, []*Service{s}, clk, rule, start, 100, time.Second, 4)
	capacity := uint64(1000)
	if rule == "gc" {
		capacity = 101
	}
	f, err := newFleetLimiter(limit.Config{Algorithm: map[string]limit.Algorithm{"tb": limit.TokenBucket, "gc": limit.GCRA}[rule],
		Limit: 1000, Window: time.Minute, Burst: map[string]uint64{"tb": 0, "gc": 100}[rule]}, DefaultValidity)
	if err != nil {
		t.Fatal(err)
	}
	v := int64(f.validity)
	// Net grants per Envoy. The service credits a return as a reduction of the first
	// grant of the Envoy's current lease (a lease begins with a grant made while the
	// Envoy held nothing), so the check does the same.
	type chunk struct {
		at int64
		n  uint64
	}
	per := map[int][]chunk{}
	first := map[int]int{}
	var granted uint64
	for _, g := range gs {
		cs := per[g.envoy]
		if g.returned > 0 {
			c := &cs[first[g.envoy]]
			if c.n < g.returned {
				t.Fatalf("%s: %d units credited back, more than the %d left of the lease's first grant", rule, g.returned, c.n)
			}
			c.n -= g.returned
		}
		if g.granted > 0 {
			if g.held == g.granted {
				first[g.envoy] = len(cs)
			}
			cs = append(cs, chunk{g.at, g.granted})
			granted += g.granted
			if g.exp-g.at > v {
				t.Fatalf("%s: lease of %v, longer than the validity %v", rule, time.Duration(g.exp-g.at), time.Duration(v))
			}
		}
		per[g.envoy] = cs
	}
	var credited uint64
	for _, g := range gs {
		credited += g.returned
	}
	t.Logf("%s: %d units granted, %d credited back", rule, granted, credited)
	var all []chunk
	for _, cs := range per {
		all = append(all, cs...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	// Units granted at x..y can all be spent within an interval of length y-x-V (or
	// at one instant): they must fit the rule's bound C + Limit·t/Window.
	for i := range all {
		var sum uint64
		for j := i; j < len(all); j++ {
			sum += all[j].n
			if j+1 < len(all) && all[j+1].at == all[j].at {
				continue
			}
			span := max(0, all[j].at-all[i].at-v)
			bound := capacity + uint64(span)*1000/uint64(time.Minute)
			if sum > bound {
				t.Fatalf("%s: %d units granted in [%d, %d], spendable within %v; bound %d", rule, sum, all[i].at, all[j].at, time.Duration(span), bound)
			}
		}
	}
	if granted < capacity {
		t.Fatalf("%s: only %d units granted", rule, granted)
	}
}

func newEnvoys(n int) []*envoy {
	es := make([]*envoy, n)
	for i := range es {
		es[i] = &envoy{id: i, name: "e" + strconv.Itoa(i)}
	}
	return es
}

// fillsExactly: four Envoys asking concurrently within one window get exactly the
// limit between them, no more, no less.
func fillsExactly(t *testing.T, b Backend) {
	clk := &clock{}
	clk.set(base() + 5*int64(time.Hour) + int64(time.Second))
	s := newService(t, b, newPolicies(t), clk)
	key := globalKey("fw")
	es := newEnvoys(4)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total uint64
	for _, e := range es {
		wg.Add(1)
		go func(e *envoy) {
			defer wg.Done()
			for refused := 0; refused < 3; {
				r := ask(t, s, e, "fw", key, 0, 0, 97)
				if r.Granted == 0 {
					refused++
					// A zero grant is a refusal, or (a grant of 0) an Envoy
					// holding its fair share unspent while the others have
					// not claimed theirs.
					heldBack := r.Status == quota.StatusGranted && r.Held >= 250
					if !heldBack && (r.Status != quota.StatusRefused || r.RetryAfter <= 0) {
						t.Errorf("refused answer %+v", r)
					}
				}
				mu.Lock()
				total += r.Granted
				mu.Unlock()
			}
		}(e)
	}
	wg.Wait()
	if total != 1000 {
		t.Fatalf("granted %d units in one window, want exactly 1000", total)
	}
}

func returnsRegrant(t *testing.T, b Backend, rule string, at int64) {
	clk := &clock{}
	clk.set(at + int64(time.Second))
	s := newService(t, b, newPolicies(t), clk)
	key := globalKey(rule)
	es := newEnvoys(2)
	var total uint64
	for i := 0; i < 200 && total < 1000; i++ {
		total += ask(t, s, es[i%2], rule, key, 0, 0, 1000).Granted
	}
	if total != 1000 {
		t.Fatalf("granted %d, want 1000", total)
	}
	if r := ask(t, s, es[1], rule, key, 0, 0, 10); r.Granted != 0 {
		t.Fatalf("granted %d over the limit", r.Granted)
	}
	held := es[0].held
	r := ask(t, s, es[0], rule, key, 0, 100, 0)
	if r.Returned != 100 || r.Held != held-100 {
		t.Fatalf("return of 100: %+v (held %d)", r, held)
	}
	// A duplicate or oversized return credits at most what is still held.
	r = ask(t, s, es[0], rule, key, 0, held, 0)
	if r.Returned != held-100 || r.Held != 0 {
		t.Fatalf("return of everything: %+v", r)
	}
	if r = ask(t, s, es[0], rule, key, 0, 50, 0); r.Returned != 0 {
		t.Fatalf("return with nothing held credited %d", r.Returned)
	}
	// The other Envoy spends what it holds and asks again: a fixed window
	// tops up a lease holding its fair share unspent only from what the
	// returning Envoy, still active, does not claim (share).
	var again uint64
	for i := 0; i < 100; i++ {
		again += ask(t, s, es[1], rule, key, es[1].held, 0, 1000).Granted
	}
	if again != held {
		t.Fatalf("after returning %d, %d were granted again", held, again)
	}
}

func expiredNotTwice(t *testing.T, b Backend, rule string, start int64) {
	clk := &clock{}
	clk.set(start + int64(time.Second))
	s := newService(t, b, newPolicies(t), clk)
	key := globalKey(rule)
	leaseEnd := start + int64(time.Minute) // fixed_window: the window's end
	if rule == "tw" {
		leaseEnd = start + int64(6*time.Second) // time_wheel: the slot's end
	}
	es := newEnvoys(2)
	var total uint64
	for i := 0; i < 200 && total < 1000; i++ {
		total += ask(t, s, es[i%2], rule, key, 0, 0, 1000).Granted
	}
	if total != 1000 {
		t.Fatalf("granted %d, want 1000", total)
	}
	held := es[0].held
	if held == 0 || es[0].exp != leaseEnd {
		t.Fatalf("lease %d units until %d, want some until %d", held, es[0].exp, leaseEnd)
	}
	// The lease ends with its window or slot; a return after that is not credited.
	clk.set(leaseEnd)
	r := ask(t, s, es[0], rule, key, 0, held, 0)
	if r.Returned != 0 || r.Held != 0 {
		t.Fatalf("return of an expired lease was credited: %+v", r)
	}
	// Once the window has passed, its units are back once: exactly the limit again.
	clk.set(start + int64(time.Minute) + int64(time.Second))
	total = 0
	for i := 0; i < 200; i++ {
		total += ask(t, s, es[i%2], rule, key, 0, 0, 1000).Granted
	}
	if total != 1000 {
		t.Fatalf("new window granted %d, want exactly 1000", total)
	}
	if rule != "fw" {
		return
	}
	// token_bucket: a lease that expired is not credited back either (its units
	// were charged when granted, and refill brings them back once).
	key = globalKey("tb")
	r = ask(t, s, es[0], "tb", key, 0, 0, 50)
	if r.Granted == 0 || r.ExpiresIn <= 0 {
		t.Fatalf("token_bucket grant: %+v", r)
	}
	clk.add(r.ExpiresIn)
	if r = ask(t, s, es[0], "tb", key, 0, r.Granted, 0); r.Returned != 0 {
		t.Fatalf("return of an expired token_bucket lease was credited: %+v", r)
	}
}

func perKeyStatus(t *testing.T, b Backend) {
	clk := &clock{}
	clk.set(base() + 17*int64(time.Hour))
	s := newService(t, b, newPolicies(t), clk)
	req := &quota.Request{Envoy: "e", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second, Keys: []quota.KeyRequest{
		{Rule: "fw", Key: globalKey("fw"), Want: 5},
		{Rule: "local", Key: globalKey("local"), Want: 5},
		{Rule: "nope", Key: globalKey("nope"), Want: 5},
		{Rule: "keyed", Key: globalKey("keyed"), Want: 5},
		{Rule: "keyed", Key: "rl:t:p/keyed:ip=10.0.0.1:60s", Want: 5},
		{Rule: "fw", Key: "rl:other:p/fw:*:60s", Want: 5},
	}}
	resp, err := s.Handle(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{quota.StatusGranted, quota.StatusNotFleet, quota.StatusUnknownRule, quota.StatusBadKey, quota.StatusGranted, quota.StatusBadKey}
	for i, w := range want {
		if resp.Keys[i].Status != w {
			t.Errorf("key %d %s: status %s, want %s", i, req.Keys[i].Key, resp.Keys[i].Status, w)
		}
	}
	req.Version = 2
	resp, err = s.Handle(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range resp.Keys {
		if resp.Keys[i].Status != quota.StatusStalePolicy || resp.Keys[i].Granted != 0 {
			t.Fatalf("key %d with a newer version: %+v", i, resp.Keys[i])
		}
	}
	if resp.Version != 1 {
		t.Fatalf("response version %d, want the current 1", resp.Version)
	}
}

// bucketReturns: on a token_bucket key nobody else touched since, units returned at
// once are credited in full and granted again: the fleet gets the whole (fleet)
// capacity, C-k = 834 units, at one instant.
func bucketReturns(t *testing.T, b Backend, rule string, capacity, first uint64, at int64) {
	clk := &clock{}
	clk.set(at)
	s := newService(t, b, newPolicies(t), clk)
	key := globalKey(rule)
	es := newEnvoys(3)
	r := ask(t, s, es[0], rule, key, 0, 0, first)
	if r.Granted != first {
		t.Fatalf("first grant: %+v", r)
	}
	r = ask(t, s, es[0], rule, key, 0, first-10, 0)
	if r.Returned != first-10 || r.Held != 10 {
		t.Fatalf("return of %d of %d: %+v", first-10, first, r)
	}
	total := uint64(10)
	for i := 0; i < 300; i++ {
		total += ask(t, s, es[1+i%2], rule, key, 0, 0, 1000).Granted
	}
	if total != capacity {
		t.Fatalf("granted %d in total at one instant, want the fleet capacity %d", total, capacity)
	}
}
