package fleetclient

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// fakeHost is shared data with Envoy's compare-and-swap semantics and a
// recorder of quota calls, answered by the test.
type fakeHost struct {
	data    map[string]stored
	cas     uint32
	now     int64
	calls   []*sentCall
	failSet func(key string) bool // a write of key loses its compare-and-swap
}

type stored struct {
	val []byte
	cas uint32
}

type sentCall struct {
	body     []byte
	req      *quota.Request
	onAnswer func(status string, body []byte)
}

func newFakeHost(t *testing.T) *fakeHost {
	return &fakeHost{data: map[string]stored{}, now: int64(1000 * time.Hour)}
}

func (h *fakeHost) GetSharedData(key string) ([]byte, uint32, error) {
	s, ok := h.data[key]
	if !ok {
		return nil, 0, proxywasm.ErrNotFound
	}
	return append([]byte(nil), s.val...), s.cas, nil
}

func (h *fakeHost) SetSharedData(key string, value []byte, cas uint32) error {
	if h.failSet != nil && h.failSet(key) {
		return proxywasm.ErrCasMismatch
	}
	if s, ok := h.data[key]; ok && cas != 0 && cas != s.cas {
		return proxywasm.ErrCasMismatch
	}
	h.cas++
	h.data[key] = stored{val: append([]byte(nil), value...), cas: h.cas}
	return nil
}

func (h *fakeHost) Call(body []byte, timeout time.Duration, onAnswer func(string, []byte)) error {
	req, err := quota.DecodeRequest(body, quota.Limits{MaxBytes: 64 << 20, MaxKeys: 1 << 20})
	if err != nil {
		return errors.New("the client sent a malformed request: " + err.Error())
	}
	h.calls = append(h.calls, &sentCall{body: append([]byte(nil), body...), req: req, onAnswer: onAnswer})
	return nil
}

func (h *fakeHost) Debug(string) {}
func (h *fakeHost) Now() int64   { return h.now }

// answer answers call c with one result per key made by f.
func (h *fakeHost) answer(c *sentCall, f func(k quota.KeyRequest) quota.KeyResult) {
	resp := &quota.Response{Policy: c.req.Policy, Version: c.req.Version, Now: h.now}
	for _, k := range c.req.Keys {
		r := f(k)
		r.Key = k.Key
		resp.Keys = append(resp.Keys, r)
	}
	c.onAnswer("200", quota.AppendResponse(nil, resp))
}

type count struct{ n uint64 }

func (c *count) Increment(n uint64) { c.n += n }

const (
	leaseKey = "sluice/p/r/lease/0"
	fp       = 0xf1
	interval = time.Second
)

type fixture struct {
	t      *testing.T
	h      *fakeHost
	c      *Client
	m      map[string]*count
	policy *Policy
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, h: newFakeHost(t), m: map[string]*count{}}
	for _, n := range []string{"calls", "failures", "refused", "retried", "unapplied"} {
		f.m[n] = &count{}
	}
	f.c = New(f.h, Config{Interval: interval, Timeout: 200 * time.Millisecond, Tick: 100 * time.Millisecond, EntriesPerBucket: 4096},
		Metrics{Calls: f.m["calls"], Failures: f.m["failures"], Refused: f.m["refused"], Retried: f.m["retried"], Unapplied: f.m["unapplied"]})
	f.c.Envoy = "envoy-1"
	f.policy = &Policy{Name: "p", Version: 1, Env: "t", Rule: func(id string) (Rule, bool) {
		return Rule{LeaseKeys: []string{leaseKey}, Fingerprint: fp}, id == "r"
	}}
	f.c.Policy = func() *Policy { return f.policy }
	return f
}

func (f *fixture) key(name string) *Key {
	k := f.c.KeyFor([]byte(name), "r", hashOf(name), 0, f.h.now)
	if k == nil {
		f.t.Fatalf("no record for %s", name)
	}
	return k
}

func hashOf(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func (f *fixture) setLease(k *Key, e fleet.Entry) {
	e.Hash, e.Fingerprint = k.Hash, fp
	old, cas, _ := f.h.GetSharedData(leaseKey)
	out, _ := fleet.Put(nil, old, e, 4096, f.h.now)
	if err := f.h.SetSharedData(leaseKey, out, cas); err != nil {
		f.t.Fatal(err)
	}
}

// spendAfterReport answers the report the fixture's first call made as
// granted, lets 300 ms pass and leaves k's lease holding held units with used
// spent since that report, last used now.
func (f *fixture) spendAfterReport(k *Key, held, used uint64) {
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult { return quota.KeyResult{Status: quota.StatusGranted} })
	f.h.now += int64(300 * time.Millisecond)
	e := f.lease(k)
	e.Held, e.Used, e.LastUse = held, used, f.h.now
	f.setLease(k, e)
}

func (f *fixture) lease(k *Key) fleet.Entry {
	v, _, _ := f.h.GetSharedData(leaseKey)
	e, _, found := fleet.Find(v, k.Hash)
	if !found {
		f.t.Fatalf("no lease entry for %s", k.Key)
	}
	return e
}

// TestRetryKeepsTheLeaseAndGivesBackWhatTheReportTook: the service answers
// retry (it recorded nothing): the units the report returned are held again
// (the lease is live), the used units are reported again next time, and the
// key degrades until min(retry_after, quota_interval), never refused.
func TestRetryKeepsTheLeaseAndGivesBackWhatTheReportTook(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Held: 10, Used: 5, Expiry: f.h.now + int64(time.Minute), LastUse: f.h.now})
	f.c.Done(f.h.now) // returns everything it holds
	if len(f.h.calls) != 1 {
		t.Fatalf("%d calls, want 1", len(f.h.calls))
	}
	if kr := f.h.calls[0].req.Keys[0]; kr.Used != 5 || kr.Return != 10 {
		t.Fatalf("report %+v, want used 5 and return 10", kr)
	}
	if e := f.lease(k); e.Held != 0 || e.Used != 0 {
		t.Fatalf("lease after the report %+v, want emptied", e)
	}
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusRetry, RetryAfter: 5 * time.Millisecond}
	})
	if e := f.lease(k); e.Held != 10 || e.Used != 5 {
		t.Fatalf("lease after retry %+v, want held 10 and used 5 again", e)
	}

	// An ask answered retry: the key degrades briefly, it is not refused.
	f.c.Ask([]*Key{k}, f.h.now)
	f.h.answer(f.h.calls[1], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusRetry, RetryAfter: 5 * time.Millisecond}
	})
	if k.RefusedUntil > f.h.now {
		t.Errorf("retry refused the key until +%v", time.Duration(k.RefusedUntil-f.h.now))
	}
	if want := f.h.now + int64(5*time.Millisecond); k.FailedUntil != want {
		t.Errorf("key degrades until +%v, want +5ms (the service's retry_after)", time.Duration(k.FailedUntil-f.h.now))
	}
	if e := f.lease(k); e.Used != 5 {
		t.Errorf("used units after the retried ask: %d, want 5 (reported again)", e.Used)
	}
	if f.m["retried"].n != 2 || f.m["refused"].n != 0 {
		t.Errorf("retried %d refused %d, want 2 and 0", f.m["retried"].n, f.m["refused"].n)
	}
}

// TestReportIsCutUnderTheServiceLimits: a thousand keys of 2 KB each (a key
// part from a client's header) would make one report of 2 MB, over the
// service's 1 MiB limit, and every key in it would lose its top-up. The
// client sends several calls, each within the limits, carrying every key once.
func TestReportIsCutUnderTheServiceLimits(t *testing.T) {
	f := newFixture(t)
	var keys []*Key
	for i := 0; i < 1000; i++ {
		keys = append(keys, f.key("rl:t:p/r:header:x-user="+strings.Repeat("u", 1950)+strconv.Itoa(i)+":60s"))
	}
	if !f.c.Ask(keys, f.h.now) {
		t.Fatal("Ask failed")
	}
	if len(f.h.calls) < 2 {
		t.Fatalf("%d call(s) for 1000 keys of 2 KB, want several", len(f.h.calls))
	}
	seen := map[string]int{}
	for _, c := range f.h.calls {
		if len(c.body) > quota.DefaultMaxBytes || len(c.req.Keys) > quota.DefaultMaxKeys {
			t.Errorf("a call of %d bytes and %d keys, over the service's limits", len(c.body), len(c.req.Keys))
		}
		for _, k := range c.req.Keys {
			seen[k.Key]++
		}
	}
	for _, k := range keys {
		if seen[k.Key] != 1 {
			t.Fatalf("key sent %d times, want once", seen[k.Key])
		}
	}
	// Each call's answer reaches its own keys.
	for _, c := range f.h.calls {
		f.h.answer(c, func(quota.KeyRequest) quota.KeyResult {
			return quota.KeyResult{Status: quota.StatusGranted, Granted: 3, Held: 3, ExpiresIn: time.Minute}
		})
	}
	for _, k := range keys {
		if e := f.lease(k); e.Held != 3 || k.Asking() {
			t.Fatalf("after the answers: lease %+v, asking %v", e, k.Asking())
		}
	}
}

// TestKeyInUseIsNotForgotten: requests spending from the lease never touch
// the key's record; the tick reads the lease's last use, so a key in use keeps
// its record (and its top-ups) however long it is used.
func TestKeyInUseIsNotForgotten(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Held: 1 << 30, Expiry: f.h.now + int64(time.Hour), LastUse: f.h.now})
	for i := 0; i < 3*idleIntervals; i++ {
		f.h.now += int64(interval)
		e := f.lease(k)
		e.LastUse, e.Used = f.h.now, 1 // a request spent from the lease
		f.setLease(k, e)
		f.c.Tick(f.h.now)
		for _, c := range f.h.calls {
			f.h.answer(c, func(quota.KeyRequest) quota.KeyResult { return quota.KeyResult{Status: quota.StatusGranted} })
		}
		f.h.calls = nil
		if f.c.Lookup(k.Key) == nil {
			t.Fatalf("the key in use was forgotten after %d intervals", i+1)
		}
	}
	// Once unused, it is forgotten.
	for i := 0; i < 2*idleIntervals && f.c.Lookup(k.Key) != nil; i++ {
		f.h.now += int64(interval)
		f.c.Tick(f.h.now)
		for _, c := range f.h.calls {
			f.h.answer(c, func(quota.KeyRequest) quota.KeyResult { return quota.KeyResult{Status: quota.StatusGranted} })
		}
		f.h.calls = nil
	}
	if f.c.Lookup(k.Key) != nil {
		t.Fatal("an unused key is never forgotten")
	}
}

// TestReportNeverReturnsUnitsStillInTheLease: when the lease edit that takes
// the units out cannot be written (its compare-and-swap keeps losing), the
// report says nothing of them: returning units the lease still holds would
// let the fleet spend them twice.
func TestReportNeverReturnsUnitsStillInTheLease(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Held: 10, Used: 4, Expiry: f.h.now + int64(time.Minute), LastUse: f.h.now})
	f.h.failSet = func(string) bool { return true }
	f.c.Done(f.h.now)
	f.c.Ask([]*Key{k}, f.h.now)
	for _, c := range f.h.calls {
		for _, kr := range c.req.Keys {
			if kr.Return > 0 || kr.Used > 0 {
				t.Errorf("reported %+v although the lease still holds its units", kr)
			}
		}
	}
	f.h.failSet = nil
	if e := f.lease(k); e.Held != 10 || e.Used != 4 {
		t.Fatalf("lease %+v, want untouched", e)
	}
}

// TestGrantWhoseLeaseEditFailedIsAppliedLater: a grant the service recorded
// but the client could not write into the lease is not dropped: it is counted
// and applied on the next tick.
func TestGrantWhoseLeaseEditFailedIsAppliedLater(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.c.Ask([]*Key{k}, f.h.now)
	f.h.failSet = func(string) bool { return true }
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 50, Held: 50, ExpiresIn: time.Minute}
	})
	if f.m["unapplied"].n == 0 {
		t.Error("the grant that could not be written was not counted")
	}
	f.h.failSet = nil
	f.h.now += int64(100 * time.Millisecond)
	f.setLease(k, fleet.Entry{LastUse: f.h.now}) // a request is using the key: not idle
	f.c.Tick(f.h.now)
	if e := f.lease(k); e.Held != 50 {
		t.Fatalf("lease after the tick %+v, want the 50 units granted", e)
	}
	// Applied once only.
	f.c.Tick(f.h.now + 1)
	if e := f.lease(k); e.Held != 50 {
		t.Fatalf("lease after another tick %+v, want 50", e)
	}
}

// TestRefusalStillRefuses: a spent budget (refused) is remembered until the
// service's retry_after, at most one interval.
func TestRefusalStillRefuses(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.c.Ask([]*Key{k}, f.h.now)
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusRefused, RetryAfter: 300 * time.Millisecond}
	})
	if k.RefusedUntil != f.h.now+int64(300*time.Millisecond) || k.FailedUntil > f.h.now {
		t.Fatalf("refused until +%v, failed until +%v", time.Duration(k.RefusedUntil-f.h.now), time.Duration(k.FailedUntil-f.h.now))
	}
}

// TestRetriedReturnNeverLandsInANewerLease: units returned from a lease that ended
// while the return was in flight, answered retry after a newer lease was applied,
// are not added to the newer lease: they ended with theirs.
func TestRetriedReturnNeverLandsInANewerLease(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Held: 100, Expiry: f.h.now + int64(time.Second), Sent: f.h.now - int64(time.Second), LastUse: f.h.now})
	f.c.Done(f.h.now) // returns the 100
	if len(f.h.calls) != 1 || f.h.calls[0].req.Keys[0].Return != 100 {
		t.Fatalf("calls %d, want one returning 100", len(f.h.calls))
	}
	// The old lease ends; a newer one of 50 is applied.
	f.h.now += int64(2 * time.Second)
	f.setLease(k, fleet.Entry{Held: 50, Expiry: f.h.now + int64(time.Minute), Sent: f.h.now - int64(time.Millisecond), LastUse: f.h.now})
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusRetry, RetryAfter: 5 * time.Millisecond}
	})
	if e := f.lease(k); e.Held != 50 {
		t.Fatalf("the newer lease holds %d after the old one's return was retried, want 50", e.Held)
	}
}

// TestANewAnswerNeverExtendsUnitsTheServiceNoLongerHolds: a grant whose answer says
// the service's entry holds only that grant (its entry was reclaimed, so the units
// still in the lease are no longer counted as this Envoy's) replaces the lease, so
// the old units never take the new lease's end; a grant the service adds to what it
// holds extends the lease as before.
func TestANewAnswerNeverExtendsUnitsTheServiceNoLongerHolds(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	oldEnd := f.h.now + int64(2*time.Second)
	f.setLease(k, fleet.Entry{Held: 40, Expiry: oldEnd, Sent: f.h.now - int64(time.Second), LastUse: f.h.now})
	f.c.Ask([]*Key{k}, f.h.now)
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 10, Held: 10, ExpiresIn: time.Minute}
	})
	if e := f.lease(k); e.Held != 10 || e.Expiry <= oldEnd {
		t.Fatalf("after a fresh grant of 10: held %d (want 10: the 40 the service no longer counts are not extended), expiry +%v",
			e.Held, time.Duration(e.Expiry-f.h.now))
	}
	// A top-up the service adds to its entry: the lease holds both.
	f.c.Ask([]*Key{k}, f.h.now)
	f.h.answer(f.h.calls[1], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 5, Held: 15, ExpiresIn: time.Minute}
	})
	if e := f.lease(k); e.Held != 15 {
		t.Fatalf("after a top-up of 5 on 10: held %d, want 15", e.Held)
	}
}

// TestAFailedCallReportsItsUsedUnitsAgain: a report whose call fails (the service
// answers 503, or no answer comes: a timeout or a reset) loses nothing the service
// needs: the used units it carried go into the next report. Its returned units are
// not held again: the service may have credited them before the answer was lost,
// and holding them again would spend them twice; they end with the lease.
func TestAFailedCallReportsItsUsedUnitsAgain(t *testing.T) {
	for _, failure := range []struct {
		name   string
		status string
	}{{"503", "503"}, {"no answer", ""}} {
		t.Run(failure.name, func(t *testing.T) {
			f := newFixture(t)
			k := f.key("rl:t:p/r:user=a:60s")
			f.setLease(k, fleet.Entry{Held: 10, Used: 5, Expiry: f.h.now + int64(time.Minute), LastUse: f.h.now})
			f.c.Done(f.h.now)
			if kr := f.h.calls[0].req.Keys[0]; kr.Used != 5 || kr.Return != 10 {
				t.Fatalf("report %+v, want used 5 and return 10", kr)
			}
			f.h.calls[0].onAnswer(failure.status, nil)
			if e := f.lease(k); e.Used != 5 || e.Held != 0 {
				t.Fatalf("lease after the failed call %+v, want used 5 again and nothing held", e)
			}
			f.h.now += int64(2 * interval)
			f.c.Ask([]*Key{k}, f.h.now)
			if got := f.h.calls[len(f.h.calls)-1].req.Keys[0].Used; got != 5 {
				t.Fatalf("the next report carries used %d, want 5", got)
			}
		})
	}
}

// TestAChargeIsBookedOnceByAServiceThatSaysItBooksCharges: units an Envoy
// admitted without a lease are sent as a charge only once an answer said the
// service books charges (an older service refuses the member); a report the
// service did not record (retry, a failed call) gives the charge back, a
// recorded one takes it for good, and one past its end is never sent.
func TestAChargeIsBookedOnceByAServiceThatSaysItBooksCharges(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Charge: 7, ChargeUntil: f.h.now + int64(time.Hour), LastUse: f.h.now})
	answer := func(c *sentCall, status string, charges bool) {
		resp := &quota.Response{Policy: c.req.Policy, Version: c.req.Version, Charges: charges}
		for _, kr := range c.req.Keys {
			resp.Keys = append(resp.Keys, quota.KeyResult{Key: kr.Key, Status: status})
		}
		c.onAnswer("200", quota.AppendResponse(nil, resp))
	}
	tick := func() *sentCall {
		n := len(f.h.calls)
		f.h.now += int64(interval)
		f.c.Tick(f.h.now)
		if len(f.h.calls) == n {
			return nil
		}
		return f.h.calls[len(f.h.calls)-1]
	}
	f.c.Ask([]*Key{k}, f.h.now)
	if got := f.h.calls[0].req.Keys[0].Charge; got != 0 {
		t.Fatalf("a charge of %d sent before the service said it books charges", got)
	}
	answer(f.h.calls[0], quota.StatusGranted, true)
	tick() // the first tick only schedules the reports
	c := tick()
	if c == nil || c.req.Keys[0].Charge != 7 {
		t.Fatalf("report after the service said it books charges: %+v, want a charge of 7", c)
	}
	if e := f.lease(k); e.Charge != 0 {
		t.Fatalf("the lease still holds a charge of %d while it is reported", e.Charge)
	}
	answer(c, quota.StatusRetry, true)
	if e := f.lease(k); e.Charge != 7 {
		t.Fatalf("after a retry the lease holds a charge of %d, want 7 back", e.Charge)
	}
	c = tick()
	if c == nil || c.req.Keys[0].Charge != 7 {
		t.Fatalf("report after the retry: %+v, want the charge of 7 again", c)
	}
	c.onAnswer("", nil) // no answer: it may or may not have been booked
	if e := f.lease(k); e.Charge != 7 {
		t.Fatalf("after a failed call the lease holds a charge of %d, want 7 back", e.Charge)
	}
	c = tick()
	answer(c, quota.StatusGranted, true)
	if e := f.lease(k); e.Charge != 0 {
		t.Fatalf("after the charge was booked the lease holds %d", e.Charge)
	}
	if c = tick(); c != nil {
		t.Fatalf("a report of nothing: %+v", c.req.Keys)
	}
	// A charge past its end is not sent.
	e := f.lease(k)
	e.AddCharge(3, f.h.now, f.h.now+int64(interval)/2)
	f.setLease(k, e)
	if c = tick(); c != nil && c.req.Keys[0].Charge != 0 {
		t.Fatalf("a lapsed charge was sent: %+v", c.req.Keys[0])
	}
}

// TestEveryWorkerKnowsHowManyEnvoysShareARule: the count of Envoys on a rule's
// keys one worker heard from the service is what every worker of the Envoy
// divides the limit by when cut off, not only the one whose call heard it (a
// worker that never asked would otherwise enforce the whole limit by itself).
func TestEveryWorkerKnowsHowManyEnvoysShareARule(t *testing.T) {
	a := newFixture(t)
	a.withStatusKey()
	b := a.secondWorker()
	k := a.key("rl:t:p/r:user=a:60s")
	a.c.Ask([]*Key{k}, a.h.now)
	a.h.answer(a.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 1, Held: 1, ExpiresIn: time.Minute, Envoys: 3}
	})
	if n := a.c.Envoys("r", k); n != 3 {
		t.Fatalf("the worker that heard it: %d Envoys, want 3", n)
	}
	if n := b.c.Envoys("r", nil); n != 3 {
		t.Errorf("another worker of the Envoy: %d Envoys, want 3", n)
	}
}

// TestAWorkerDegradedForWantOfAnAnswerAsksOnceAnotherWasAnswered: a worker
// whose call found no service degrades for an interval; once another worker
// of the Envoy is answered for a key of the rule, it may ask again at once
// (Reachable), rather than admit by itself for the rest of the interval.
func TestAWorkerDegradedForWantOfAnAnswerAsksOnceAnotherWasAnswered(t *testing.T) {
	a := newFixture(t)
	a.withStatusKey()
	b := a.secondWorker()
	kb := b.key("rl:t:p/r:user=a:60s")
	b.c.Ask([]*Key{kb}, b.h.now)
	b.h.calls[0].onAnswer("", nil) // no service
	if kb.FailedUntil <= b.h.now || b.c.Reachable(kb) {
		t.Fatalf("after a failed call: degraded until +%v, reachable %v", time.Duration(kb.FailedUntil-b.h.now), b.c.Reachable(kb))
	}
	a.h.now += int64(100 * time.Millisecond)
	ka := a.key("rl:t:p/r:user=a:60s")
	a.c.Ask([]*Key{ka}, a.h.now)
	a.h.answer(a.h.calls[1], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 1, Held: 1, ExpiresIn: time.Minute, Envoys: 2}
	})
	if !b.c.Reachable(kb) || kb.FailedUntil != 0 {
		t.Fatalf("another worker was answered: reachable false or still degraded until %d", kb.FailedUntil)
	}
}

// TestAChargeAnsweredStalePolicyIsKept: a report answered stale_policy (the
// store lost the policy and it was written back under a new epoch) recorded
// nothing: its charge goes back into the lease for the next report.
func TestAChargeAnsweredStalePolicyIsKept(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	f.setLease(k, fleet.Entry{Charge: 4, ChargeUntil: f.h.now + int64(time.Hour), LastUse: f.h.now})
	f.c.charges = true
	f.c.Ask([]*Key{k}, f.h.now)
	c := f.h.calls[0]
	if c.req.Keys[0].Charge != 4 {
		t.Fatalf("charge sent %d, want 4", c.req.Keys[0].Charge)
	}
	f.h.answer(c, func(quota.KeyRequest) quota.KeyResult { return quota.KeyResult{Status: quota.StatusStalePolicy} })
	if e := f.lease(k); e.Charge != 4 {
		t.Fatalf("after stale_policy the lease holds a charge of %d, want 4 back", e.Charge)
	}
}

// TestAChargeOnALostCountHoldsTheKeysForTwoIntervals: a charge booked on a key
// whose answer counts fewer Envoys than before (the store lost the key's count:
// its fresh ledger knows only those that reported since) holds the rule's keys
// degraded for two report intervals, so the other Envoys' charges are booked
// before any fresh units are granted; one booked on an intact count holds
// nothing.
func TestAChargeOnALostCountHoldsTheKeysForTwoIntervals(t *testing.T) {
	for _, c := range []struct {
		before, answered uint32
		held             bool
	}{{3, 1, true}, {3, 3, false}, {0, 1, false}} { // 0: a key new to the worker, its fresh ledger no loss
		f := newFixture(t)
		f.withStatusKey()
		k := f.key("rl:t:p/r:user=a:60s")
		k.Envoys = c.before
		f.c.ruleEnvoys["r"] = 3 // the rule's other keys were shared by three
		f.setLease(k, fleet.Entry{Charge: 5, ChargeUntil: f.h.now + int64(time.Hour), LastUse: f.h.now})
		f.c.charges = true
		f.c.Ask([]*Key{k}, f.h.now)
		if w := f.h.calls[0].req.Keys[0].Want; w != 0 {
			t.Fatalf("an ask booking a charge wants %d, want 0", w)
		}
		f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
			return quota.KeyResult{Status: quota.StatusGranted, Envoys: c.answered}
		})
		until, held := f.c.Held("r", f.h.now)
		if held != c.held {
			t.Errorf("answered %d Envoys (%d before on the key): held %v, want %v", c.answered, c.before, held, c.held)
		}
		if held && (until != f.h.now+2*int64(interval) || k.FailedUntil != until) {
			t.Errorf("held until +%v (key until +%v), want two intervals", time.Duration(until-f.h.now), time.Duration(k.FailedUntil-f.h.now))
		}
	}
}

// withStatusKey gives the fixture's rule a StatusKey, so that its workers
// share what the service said (Rule.StatusKey).
func (f *fixture) withStatusKey() {
	f.policy.Rule = func(id string) (Rule, bool) {
		return Rule{LeaseKeys: []string{leaseKey}, Fingerprint: fp, StatusKey: "sluice/p/r/status"}, id == "r"
	}
}

// secondWorker returns another worker of the same Envoy: a client of its own
// over the same shared data and policy.
func (f *fixture) secondWorker() *fixture {
	b := &fixture{t: f.t, h: f.h, m: f.m, policy: f.policy}
	b.c = New(f.h, Config{Interval: interval, Timeout: 200 * time.Millisecond, Tick: 100 * time.Millisecond, EntriesPerBucket: 4096}, Metrics{})
	b.c.Envoy, b.c.Policy = f.c.Envoy, f.c.Policy
	return b
}

// TestALeaseRunningLowAtTheEnvoysRateIsToppedUp: every worker of an Envoy
// spends from one lease, so each worker's report takes out only the units
// spent since the last report of any worker. A worker reporting 100 ms after
// another sees 10 units used; at the Envoy's rate (100 units a second) the
// 200 units left last two intervals, so it asks for more, as a lone worker
// seeing 100 used in its interval would. Judged by the worker's own share
// (10), it only reported, and with enough workers the lease ran dry before
// any report asked.
func TestALeaseRunningLowAtTheEnvoysRateIsToppedUp(t *testing.T) {
	a := newFixture(t)
	b := a.secondWorker()
	ka := a.key("rl:t:p/r:user=a:60s")
	b.key("rl:t:p/r:user=a:60s") // b knows the key too
	t0 := a.h.now
	b.c.Tick(t0)                               // b reports at t0 + 1 s
	a.c.Tick(t0 + int64(100*time.Millisecond)) // a at t0 + 1.1 s
	a.h.now = t0 + int64(interval)
	a.setLease(ka, fleet.Entry{Held: 210, Used: 100, Expiry: a.h.now + int64(time.Minute), LastUse: a.h.now})
	b.c.Tick(a.h.now)
	if len(a.h.calls) != 1 || a.h.calls[0].req.Keys[0].Want != 0 || a.h.calls[0].req.Keys[0].Used != 100 {
		t.Fatalf("b's tick: %d calls, want one reporting 100 used and asking nothing (210 left > two intervals of 100)", len(a.h.calls))
	}
	a.h.now += int64(100 * time.Millisecond)
	e := a.lease(ka)
	e.Held, e.Used, e.LastUse = e.Held-10, e.Used+10, a.h.now
	a.setLease(ka, e)
	a.c.Tick(a.h.now)
	if len(a.h.calls) != 2 {
		t.Fatalf("a's tick: %d calls in all, want 2", len(a.h.calls))
	}
	got := a.h.calls[1].req.Keys[0]
	if got.Used != 10 || got.Want == 0 {
		t.Fatalf("a's tick sent used %d want %d; want used 10 and an ask (200 left, two intervals at the Envoy's rate)", got.Used, got.Want)
	}
}

// TestALeaseThatWouldRunDryBeforeTheNextReportIsToppedUpAtOnce: between
// reports, a worker asks for a key whose lease, at the Envoy's rate, would run
// dry before its next report and the answer (two ticks): 300 ms after a report
// at 100 units a second, 60 units left last 600 ms, and the next report is
// 700 ms away. A lease that lasts until then is left alone, and no key is
// asked for twice while its call is in flight.
func TestALeaseThatWouldRunDryBeforeTheNextReportIsToppedUpAtOnce(t *testing.T) {
	for _, c := range []struct {
		held uint64
		ask  bool
	}{{60, true}, {200, false}} {
		f := newFixture(t)
		k := f.key("rl:t:p/r:user=a:60s")
		t0 := f.h.now
		f.c.Tick(t0) // reports at t0 + 1 s
		f.h.now = t0 + int64(interval)
		f.setLease(k, fleet.Entry{Held: 1000, Used: 100, Expiry: f.h.now + int64(time.Minute), LastUse: f.h.now})
		f.c.Tick(f.h.now)
		if len(f.h.calls) != 1 || f.h.calls[0].req.Keys[0].Want != 0 {
			t.Fatalf("the report: %d calls, want one reporting (no ask: 1,000 held)", len(f.h.calls))
		}
		f.spendAfterReport(k, c.held, 30)
		f.c.Tick(f.h.now)
		asked := len(f.h.calls) == 2 && f.h.calls[1].req.Keys[0].Want > 0
		if asked != c.ask {
			t.Fatalf("%d held, 30 used in 300 ms, next report in 700 ms: asked %v, want %v", c.held, asked, c.ask)
		}
		f.h.now += int64(100 * time.Millisecond)
		f.c.Tick(f.h.now)
		if want := map[bool]int{true: 2, false: 1}[c.ask]; len(f.h.calls) != want {
			t.Fatalf("%d held: %d calls after the next tick, want %d", c.held, len(f.h.calls), want)
		}
	}
}

// TestMulAtMostComparesFullProducts: products past 64 bits (units as large as
// a lease may hold, times nanoseconds) compare whole, never wrapped.
func TestMulAtMostComparesFullProducts(t *testing.T) {
	for _, c := range []struct {
		a, b, c, d uint64
		want       bool
	}{
		{1 << 63, 4, 1 << 62, 8, true},
		{1 << 63, 5, 1 << 62, 8, false},
		{1<<64 - 1, 1<<64 - 1, 1<<64 - 1, 1<<64 - 1, true},
		{3, 1 << 62, 1, 1<<63 + 1<<62, true},
		{0, 0, 0, 0, true},
		{1, 1, 0, 5, false},
	} {
		if got := mulAtMost(c.a, c.b, c.c, c.d); got != c.want {
			t.Errorf("mulAtMost(%d, %d, %d, %d) = %v, want %v", c.a, c.b, c.c, c.d, got, c.want)
		}
	}
}

// TestAWindowedLeaseIsToppedUpOnTheWorkersOwnUse: a fixed window's fair shares
// go to the Envoys that ask, so its leases are judged by the reporting
// worker's own use and only at reports: 200 left after 10 used in 100 ms
// (two intervals at the Envoy's rate) is reported, not asked for, and no tick
// between reports asks.
func TestAWindowedLeaseIsToppedUpOnTheWorkersOwnUse(t *testing.T) {
	f := newFixture(t)
	f.policy.Rule = func(id string) (Rule, bool) {
		return Rule{LeaseKeys: []string{leaseKey}, Fingerprint: fp, Windowed: true}, id == "r"
	}
	k := f.key("rl:t:p/r:user=a:60s")
	t0 := f.h.now
	f.c.Tick(t0)
	f.h.now = t0 + int64(interval)
	f.setLease(k, fleet.Entry{Held: 200, Used: 10, Reported: f.h.now - int64(100*time.Millisecond),
		Expiry: f.h.now + int64(time.Minute), LastUse: f.h.now})
	f.c.Tick(f.h.now)
	if len(f.h.calls) != 1 || f.h.calls[0].req.Keys[0].Want != 0 {
		t.Fatalf("%d calls, want one report asking nothing", len(f.h.calls))
	}
	f.spendAfterReport(k, 5, 30)
	f.c.Tick(f.h.now)
	if len(f.h.calls) != 1 {
		t.Fatalf("a tick between reports made a call for a windowed rule")
	}
}

// TestAnAnswerKeepsWhatTheWindowHadLeftInTheLeaseItGranted: an answer's left
// (a fixed window's share of what was left beyond every lease) lands in the
// lease entry its grant made, valid until the window's end measured from the
// send; a refusal for a key that holds no lease makes no entry for it (one
// could evict a live lease from a full bucket).
func TestAnAnswerKeepsWhatTheWindowHadLeftInTheLeaseItGranted(t *testing.T) {
	f := newFixture(t)
	k := f.key("rl:t:p/r:user=a:60s")
	sent := f.h.now
	f.c.Ask([]*Key{k}, sent)
	f.h.now += int64(10 * time.Millisecond)
	f.h.answer(f.h.calls[0], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusGranted, Granted: 16, Held: 16, ExpiresIn: 30 * time.Second, Left: 7, LeftFor: 30 * time.Second}
	})
	if e := f.lease(k); e.Held != 16 || e.Left != 7 || e.LeftUntil != sent+int64(30*time.Second) {
		t.Fatalf("lease after the grant: %+v, want 16 held, left 7 until the send + 30s", e)
	}

	other := f.key("rl:t:p/r:user=b:60s")
	f.c.Ask([]*Key{other}, f.h.now)
	f.h.answer(f.h.calls[1], func(quota.KeyRequest) quota.KeyResult {
		return quota.KeyResult{Status: quota.StatusRefused, RetryAfter: time.Second, LeftFor: 30 * time.Second}
	})
	v, _, _ := f.h.GetSharedData(leaseKey)
	if _, _, found := fleet.Find(v, other.Hash); found {
		t.Fatal("a refusal of a key without a lease made an entry for its left")
	}
}
