package rls

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// budgetPolicy is one key of 2,000 a minute, one of 10 a minute per user,
// and the descriptors of envoyproxy/ratelimit's language that are answered
// without counting: no limit, a limit of 0, quota mode, a shared wildcard.
const budgetPolicy = `{"policy":"b","rules":[
 {"id":"busy","descriptor":{"domain":"b","entries":[{"key":"k","value":"busy"}]},"algorithm":"fixed_window","limit":2000,"window":"1m","scope":"fleet"},
 {"id":"user","descriptor":{"domain":"b","entries":[{"key":"user"}],"name":"per-user"},"algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
 {"id":"free","descriptor":{"domain":"b","entries":[{"key":"user","value":"root"}],"no_limit":true}},
 {"id":"banned","descriptor":{"domain":"b","entries":[{"key":"k","value":"banned"}]},"algorithm":"fixed_window","limit":0,"window":"1m","scope":"fleet"},
 {"id":"quota","descriptor":{"domain":"b","entries":[{"key":"k","value":"quota"}],"quota_mode":true},"algorithm":"fixed_window","limit":2,"window":"1m","scope":"fleet"},
 {"id":"files","descriptor":{"domain":"b","entries":[{"key":"file","value":"files/*","shared":true}]},"algorithm":"fixed_window","limit":3,"window":"1m","scope":"fleet"}
]}`

func hitsDesc(h uint64, kv ...string) *commonrl.RateLimitDescriptor {
	d := desc(kv...)
	d.HitsAddend = wrapperspb.UInt64(h)
	return d
}

// TestAnyHitsTheWindowHoldsAreAdmitted: on a fresh window of 10, a call of h
// hits is admitted for every h from 1 to 10, answering 10-h remaining, and one
// of 11 is refused with nothing remaining; a check of 0 hits on a key never
// asked for says the whole limit remains.
func TestAnyHitsTheWindowHoldsAreAdmitted(t *testing.T) {
	f := newFixture(t, budgetPolicy)
	r := f.replica(t, "a", "")
	if st := r.call(t, "b", hitsDesc(0, "user", "fresh")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 10 {
		t.Fatalf("a check of 0 hits on a fresh key: %v, want OK with 10 remaining", st)
	}
	for h := uint64(1); h <= 10; h++ {
		user := "u" + string(rune('a'+h))
		st := r.call(t, "b", hitsDesc(h, "user", user)).Statuses[0]
		if st.Code != rlsv3.RateLimitResponse_OK || uint64(st.LimitRemaining) != 10-h {
			t.Errorf("%d hits on a fresh window of 10: %v, want OK with %d remaining", h, st, 10-h)
		}
	}
	st := r.call(t, "b", hitsDesc(11, "user", "big")).Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
		t.Errorf("11 hits on a window of 10: %v, want OVER_LIMIT with 0 remaining", st)
	}
	// After 8 of 10, a call of 3 is refused and one of 2 still admitted: a
	// refusal does not keep a smaller call from what is left.
	r.call(t, "b", hitsDesc(8, "user", "after"))
	if st := r.call(t, "b", hitsDesc(3, "user", "after")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("3 hits with 2 left: %v", st)
	}
	if st := r.call(t, "b", hitsDesc(2, "user", "after")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 0 {
		t.Errorf("2 hits with 2 left, after a refusal of 3: %v, want OK with 0 remaining", st)
	}
}

// TestConcurrentCallersAreNeverRefusedWhileTheWindowHasBudget: 128 callers on
// one key of 2,000 a minute, one replica on the real clock, 20 calls each
// (2,560 in all): exactly 2,000 admitted, and no call is refused before a call
// that is then admitted has started (the refusal was made with budget left).
func TestConcurrentCallersAreNeverRefusedWhileTheWindowHasBudget(t *testing.T) {
	f := realClockFixture(t)
	spendTheWindow(t, 10*time.Second, callers{f.replica(t, "a", ""), 128, new(atomic.Int64), 2560})
}

// TestTwoReplicasNeverRefuseWhileTheOtherHoldsUnspentUnits: 64 callers, three
// quarters of them on one replica and a quarter on the other, send 2,600
// calls of one key of 2,000 a minute between them, each call given Envoy's
// ratelimit filter timeout of the generated configuration (100 ms): a
// replica whose lease and the key's last units are spent while the other
// replica still holds units of its lease does not answer OVER_LIMIT before
// the other has spent or returned them.
func TestTwoReplicasNeverRefuseWhileTheOtherHoldsUnspentUnits(t *testing.T) {
	f := realClockFixture(t)
	sent := new(atomic.Int64)
	spendTheWindow(t, 100*time.Millisecond,
		callers{f.replica(t, "a", ""), 48, sent, 2600}, callers{f.replica(t, "b", ""), 16, sent, 2600})
}

// TestAReplicaWhoseDemandStoppedGivesItsUnitsToOneThatIsShort: on one key of
// 2,000 a minute, one replica's 48 callers send 1,920 calls and the other's
// 16 callers 640, then stop, each call given 100 ms: the units the second
// replica's lease holds when its calls stop reach the first replica's
// callers (recalled), so exactly 2,000 are admitted, none refused before an
// admitted call started.
func TestAReplicaWhoseDemandStoppedGivesItsUnitsToOneThatIsShort(t *testing.T) {
	f := realClockFixture(t)
	spendTheWindow(t, 100*time.Millisecond,
		callers{f.replica(t, "a", ""), 48, new(atomic.Int64), 1920}, callers{f.replica(t, "b", ""), 16, new(atomic.Int64), 640})
}

// realClockFixture is a fixture of budgetPolicy on the real clock, at least
// 20 s before the current minute ends.
func realClockFixture(t *testing.T) *fixture {
	f := newFixture(t, budgetPolicy)
	f.clk = nil
	proctest.AwaitOneWindow(t, time.Minute, 20*time.Second)
	return f
}

// callers are n goroutines calling replica r with the descriptor k=busy
// until sent counts calls (shared with other callers or not).
type callers struct {
	r     *replica
	n     int
	sent  *atomic.Int64
	calls int64
}

// spendTheWindow runs every group of callers, each call within timeout, and
// asserts that exactly the key's 2,000 were admitted and none was refused
// before an admitted call started (their order by a sequence counter).
func spendTheWindow(t *testing.T, timeout time.Duration, groups ...callers) {
	t.Helper()
	type span struct {
		start, end int64
		ok         bool
	}
	var mu sync.Mutex
	var spans []span
	var seq atomic.Int64
	var wg sync.WaitGroup
	for _, g := range groups {
		for range g.n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g.sent.Add(1) <= g.calls {
					start := seq.Add(1)
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					resp, err := g.r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "b",
						Descriptors: []*commonrl.RateLimitDescriptor{desc("k", "busy")}})
					cancel()
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					spans = append(spans, span{start: start, end: seq.Add(1), ok: resp.OverallCode == rlsv3.RateLimitResponse_OK})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	admitted, early, lastStart := 0, 0, int64(0)
	for _, s := range spans {
		if s.ok {
			admitted++
			lastStart = max(lastStart, s.start)
		}
	}
	for _, s := range spans {
		if !s.ok && s.end < lastStart {
			early++
		}
	}
	if admitted != 2000 || early != 0 {
		t.Errorf("admitted %d of 2,000; %d calls refused before an admitted call started", admitted, early)
	}
}

// TestDescriptorsAnsweredAsEnvoyproxyRatelimitAnswersThem: a value without a
// limit (no_limit) is answered OK with no limit where its key is limited; a
// limit of 0 refuses every call but a check of 0 hits; quota mode answers a
// call over its limit OK with the limit and nothing remaining, no reset; a
// shared wildcard counts every value on one counter; a rule's name is its
// limit's.
func TestDescriptorsAnsweredAsEnvoyproxyRatelimitAnswersThem(t *testing.T) {
	f := newFixture(t, budgetPolicy)
	r := f.replica(t, "a", "")
	for i := 0; i < 12; i++ {
		if st := r.call(t, "b", desc("user", "root")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != 0 {
			t.Fatalf("no_limit call %d: %v", i, st)
		}
	}
	if st := r.call(t, "b", desc("user", "bob")).Statuses[0]; st.CurrentLimit.GetName() != "per-user" || st.LimitRemaining != 9 {
		t.Errorf("a named rule: %v", st)
	}
	if st := r.call(t, "b", desc("k", "banned")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		st.CurrentLimit.GetRequestsPerUnit() != 0 || st.DurationUntilReset.GetSeconds() != 60 {
		t.Errorf("limit 0: %v", st)
	}
	if st := r.call(t, "b", hitsDesc(0, "k", "banned")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK {
		t.Errorf("limit 0, 0 hits: %v", st)
	}
	for i, want := range []uint32{1, 0, 0} {
		resp := r.call(t, "b", desc("k", "quota"))
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != want ||
			st.CurrentLimit.GetRequestsPerUnit() != 2 || (i == 2) != (st.DurationUntilReset == nil) {
			t.Errorf("quota mode call %d: %v", i, resp)
		}
	}
	for i, v := range []string{"files/a", "files/b", "files/c", "files/d"} {
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st := r.call(t, "b", desc("file", v)).Statuses[0]; st.Code != want {
			t.Errorf("shared wildcard, value %s: %v, want %v", v, st, want)
		}
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_descriptors_total", "result", "no_limit"); got != 12 {
		t.Errorf("no_limit descriptors counted %v, want 12", got)
	}
	// Each descriptor once, by its result: the quota-mode calls over the
	// limit (the third) as quota_mode, not also as over_limit (limit 0's call and the
	// shared wildcard's fourth are the over_limit ones).
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_descriptors_total", "result", "quota_mode"); got != 1 {
		t.Errorf("quota_mode descriptors counted %v, want 1", got)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_descriptors_total", "result", "over_limit"); got != 2 {
		t.Errorf("over_limit descriptors counted %v, want 2", got)
	}
}

// TestKeysPastTheLeaseBoundAreDecidedExactly: a replica that holds its bound
// of leases decides a further key by an ask of its own for exactly the call's
// hits, never a refill that nobody spends: 20 calls on a fresh key of 10 a
// minute admit 10, and a check of 0 hits says how many remain.
func TestKeysPastTheLeaseBoundAreDecidedExactly(t *testing.T) {
	f := newFixture(t, budgetPolicy)
	r := f.replica(t, "a", "", func(o *Options) { o.MaxLeases = 1 })
	r.call(t, "b", desc("k", "busy")) // the one lease
	if st := r.call(t, "b", hitsDesc(0, "user", "past")).Statuses[0]; st.LimitRemaining != 10 {
		t.Errorf("a check past the bound: %v, want 10 remaining", st)
	}
	admitted := 0
	for range 20 {
		if r.call(t, "b", desc("user", "past")).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("past the lease bound, 20 calls on a fresh key of 10: %d admitted, want 10", admitted)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_leases_full_total", "", ""); got < 21 {
		t.Errorf("decisions past the bound counted %v, want 21", got)
	}
}

// TestWhatOnQuotaFailureAdmitsIsChargedWhenTheStoreAnswersAgain: Redis
// stalled (SIGSTOP), a replica admits a window of 10 by on_quota_failure
// local; once Redis answers again those 10 are charged to the key, so the
// window admits nothing more: 10 in the window, not 20.
func TestWhatOnQuotaFailureAdmitsIsChargedWhenTheStoreAnswersAgain(t *testing.T) {
	f := newFixture(t, budgetPolicy)
	r := f.replica(t, "a", "")
	if err := f.redis.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stalled := 0
	for range 12 {
		if r.call(t, "b", desc("user", "stall")).OverallCode == rlsv3.RateLimitResponse_OK {
			stalled++
		}
	}
	if err := f.redis.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.clk.advance(2 * time.Second) // past the hold after a failed ask
	after := 0
	for range 12 {
		if r.call(t, "b", desc("user", "stall")).OverallCode == rlsv3.RateLimitResponse_OK {
			after++
		}
	}
	if stalled != 10 || after != 0 {
		t.Errorf("a window of 10: %d admitted while Redis stalled, %d after, want 10 and 0", stalled, after)
	}
	if got := counterWith(t, r.reg, "sluice_controlplane_rls_failure_decisions_total", "code", "ok"); got != 10 {
		t.Errorf("failure decisions admitted %v, want 10", got)
	}
}

// TestAReplicaHoldsAboutASecondOfItsDemandAndReturnsItWhenItStops: on a key of
// 100 an hour, replica b takes a call a second for 3 s, then replica a calls
// until refused: b holds about a second of its demand (not half the hour's
// budget), so a is admitted all but a few units; when b stops
// (ReturnLeases) they come back and a takes every unit left: 100 in the hour.
func TestAReplicaHoldsAboutASecondOfItsDemandAndReturnsItWhenItStops(t *testing.T) {
	const hourly = `{"policy":"h","rules":[{"id":"hour","descriptor":{"domain":"h","entries":[{"key":"k","value":"v"}]},"algorithm":"fixed_window","limit":100,"window":"1h","scope":"fleet"}]}`
	f := newFixture(t, hourly)
	a, b := f.replica(t, "a", ""), f.replica(t, "b", "")
	admitted := 0
	for range 3 {
		if b.call(t, "h", desc("k", "v")).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
		f.clk.advance(time.Second)
	}
	callA := func() int {
		n := 0
		for range 120 {
			if a.call(t, "h", desc("k", "v")).OverallCode == rlsv3.RateLimitResponse_OK {
				n++
			}
			f.clk.advance(10 * time.Millisecond)
		}
		return n
	}
	first := callA()
	if admitted+first < 95 || admitted+first > 100 {
		t.Errorf("b took %d, then a %d: b holds %d of the hour's 100 unused, want at most 5", admitted, first, 100-admitted-first)
	}
	if n := b.srv.ReturnLeases(context.Background()); n != 1 {
		t.Errorf("b returned %d leases, want 1", n)
	}
	second := callA()
	if total := admitted + first + second; total != 100 {
		t.Errorf("after b stopped, a took %d more: %d in the hour, want 100", second, total)
	}
}

// TestAReplicaKilledMidWindowStrandsNoneOfASmallKeysBudget: a replica that
// dies mid-window (no report, no return: as SIGKILL leaves the ledger) holds
// nothing the key's other replicas could have admitted. Replica a admits 4 of
// a key of 10 a minute and 10 of a key of 100 a day in quick succession and
// dies; replica b and a restarted a (a new ledger entry, as a new process
// is) then admit the rest, 6 and 90, and refuse only after them: 10 in the
// minute, 100 in the day.
func TestAReplicaKilledMidWindowStrandsNoneOfASmallKeysBudget(t *testing.T) {
	const small = `{"policy":"s","rules":[
 {"id":"minute","descriptor":{"domain":"s","entries":[{"key":"k","value":"minute"}]},"algorithm":"fixed_window","limit":10,"window":"1m","scope":"fleet"},
 {"id":"day","descriptor":{"domain":"s","entries":[{"key":"k","value":"day"}]},"algorithm":"fixed_window","limit":100,"window":"24h","scope":"fleet"}]}`
	f := newFixture(t, small)
	a, b := f.replica(t, "a", ""), f.replica(t, "b", "")
	keys := []struct {
		value      string
		limit, onA int
	}{{"minute", 10, 4}, {"day", 100, 10}}
	for _, c := range keys {
		for i := range c.onA {
			if a.call(t, "s", desc("k", c.value)).OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s: a's call %d refused", c.value, i)
			}
			f.clk.advance(time.Millisecond)
		}
	}
	a.kill()
	after := []*replica{b, f.replica(t, "a-restarted", "")}
	for _, c := range keys {
		admitted, firstRefused := 0, -1
		for i := range c.limit + 10 {
			if after[i%2].call(t, "s", desc("k", c.value)).OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
				if firstRefused >= 0 {
					t.Errorf("%s: call %d admitted after call %d was refused", c.value, i, firstRefused)
				}
			} else if firstRefused < 0 {
				firstRefused = i
			}
			f.clk.advance(time.Millisecond)
		}
		if c.onA+admitted != c.limit {
			t.Errorf("%s: a admitted %d and died, then b and a restarted %d: %d in the window, want %d", c.value, c.onA, admitted, c.onA+admitted, c.limit)
		}
	}
}

// TestTwoReplicasAtNinetyTenSpendAnHoursAndADaysEveryUnit: 100 calls a
// second, nine of ten to replica a and one to b (as Envoy's connections pin
// its calls to one replica), on a key of 1,000 an hour and one of 5,000 a
// day, until 20 % past the limit: exactly the limit admitted, and no call
// refused before the last admitted one (the light replica holds no units
// the heavy one's callers are refused for).
func TestTwoReplicasAtNinetyTenSpendAnHoursAndADaysEveryUnit(t *testing.T) {
	const long = `{"policy":"l","rules":[
 {"id":"hour","descriptor":{"domain":"l","entries":[{"key":"k","value":"hour"}]},"algorithm":"fixed_window","limit":1000,"window":"1h","scope":"fleet"},
 {"id":"day","descriptor":{"domain":"l","entries":[{"key":"k","value":"day"}]},"algorithm":"fixed_window","limit":5000,"window":"24h","scope":"fleet"}]}`
	f := newFixture(t, long)
	a, b := f.replica(t, "a", ""), f.replica(t, "b", "")
	for _, c := range []struct {
		value string
		limit int
	}{{"hour", 1000}, {"day", 5000}} {
		admitted, lastAdmitted, firstRefused := 0, -1, -1
		for i := range c.limit * 6 / 5 {
			r := a
			if i%10 == 9 {
				r = b
			}
			if r.call(t, "l", desc("k", c.value)).OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
				lastAdmitted = i
			} else if firstRefused < 0 {
				firstRefused = i
			}
			f.clk.advance(10 * time.Millisecond)
		}
		t.Logf("%s: %d admitted; first refusal at call %d, last admission at %d", c.value, admitted, firstRefused, lastAdmitted)
		if admitted != c.limit || firstRefused < lastAdmitted {
			t.Errorf("%s: %d admitted, want %d; a call was refused (call %d) before the last admitted one (%d)", c.value, admitted, c.limit, firstRefused, lastAdmitted)
		}
	}
}
