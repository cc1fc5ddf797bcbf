package policysync

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

var epoch = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

// policyDoc returns a valid policy document of the given version whose
// single rule "r" has the given limit.
func policyDoc(version, limit int) string {
	return `{"policy":"default","version":` + strconv.Itoa(version) +
		`,"rules":[{"id":"r","algorithm":"fixed_window","limit":` + strconv.Itoa(limit) + `,"window":"1m"}]}`
}

func etag(version int) [][2]string { return [][2]string{{"etag", `"v` + strconv.Itoa(version) + `"`}} }

// worker is one simulated VM: its Host and Syncer and what it applied.
type worker struct {
	h       *fakeHost
	s       *Syncer
	applied []*rules.Compiled
}

func (w *worker) version() uint64 {
	if len(w.applied) == 0 {
		return 0
	}
	return w.applied[len(w.applied)-1].Version
}

// env is an Envoy with n workers over one store and one clock.
type env struct {
	t     *testing.T
	st    *store
	clk   *clock
	ws    []*worker
	opts  Options
	token uint64
}

func newEnv(t *testing.T, n int, mod func(*Options)) *env {
	t.Helper()
	e := &env{t: t, st: newStore(), clk: &clock{t: epoch}}
	e.opts = Options{
		Policy: "default", Cluster: "control_plane", Authority: "cp.internal", Token: "read-token",
		Wait: 30 * time.Second, Tick: 100 * ms,
		Int64N: func(int64) int64 { return 0 },
	}
	if mod != nil {
		mod(&e.opts)
	}
	for range n {
		e.add()
	}
	return e
}

// add starts another worker (Start included).
func (e *env) add() *worker {
	e.t.Helper()
	w := &worker{h: newFakeHost(e.t, e.st)}
	o := e.opts
	e.token++
	o.Host, o.Now, o.VMToken = w.h, e.clk.now, e.token
	o.Apply = func(c *rules.Compiled) error { w.applied = append(w.applied, c); return nil }
	s, err := New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	w.s = s
	s.Start()
	e.ws = append(e.ws, w)
	return w
}

// tick advances the clock by one tick and ticks every live worker in order.
func (e *env) tick(live ...*worker) {
	e.clk.advance(e.opts.Tick)
	if live == nil {
		live = e.ws
	}
	for _, w := range live {
		w.s.Tick()
	}
}

// holders returns the workers holding the lease.
func (e *env) holders() []*worker {
	var out []*worker
	for _, w := range e.ws {
		if w.s.Holding() {
			out = append(out, w)
		}
	}
	return out
}

func (e *env) holder() *worker {
	e.t.Helper()
	hs := e.holders()
	if len(hs) != 1 {
		e.t.Fatalf("%d lease holders, want 1", len(hs))
	}
	return hs[0]
}

// totalCalls is the number of HTTP calls dispatched by all workers.
func (e *env) totalCalls() int {
	n := 0
	for _, w := range e.ws {
		n += len(w.h.calls)
	}
	return n
}

func TestOnePollPerEnvoyAndPropagation(t *testing.T) {
	e := newEnv(t, 4, nil)
	e.tick()
	hw := e.holder()
	if n := e.totalCalls(); n != 1 {
		t.Fatalf("%d calls dispatched, want 1", n)
	}
	c := hw.h.lastCall()
	for k, want := range map[string]string{
		":method": "GET", ":path": "/v1/policies/default?wait=30s", ":authority": "cp.internal",
		"authorization": "Bearer read-token", "if-none-match": "",
	} {
		if got := c.header(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if c.cluster != "control_plane" || c.timeout != 33000 {
		t.Errorf("cluster %q timeout %d ms; want control_plane, 33000", c.cluster, c.timeout)
	}

	// More ticks while the poll is open: no second call, the lease stays.
	for range 20 {
		e.tick()
	}
	if n := e.totalCalls(); n != 1 || e.holder() != hw {
		t.Fatalf("after 20 ticks: %d calls, holder changed %v", n, e.holder() != hw)
	}

	// The change arrives: the holder publishes and applies at once and
	// polls again with the new ETag; the others apply on their next check.
	hw.h.respond(c, "200", etag(1), policyDoc(1, 10))
	if hw.version() != 1 {
		t.Fatalf("holder applied version %d, want 1", hw.version())
	}
	if got := hw.h.lastCall().header("if-none-match"); got != `"v1"` || len(hw.h.calls) != 2 {
		t.Errorf("next poll: %d calls, if-none-match %q; want 2, \"v1\"", len(hw.h.calls), got)
	}
	e.clk.advance(RequestCheckInterval)
	for _, w := range e.ws {
		w.s.Check(nowOf(w.s))
		if w.version() != 1 || len(w.applied) != 1 {
			t.Errorf("worker applied %d policies, version %d; want 1, 1", len(w.applied), w.version())
		}
	}
	if v, ok := e.ws[0].s.Version(); !ok || v != 1 {
		t.Errorf("Version() = %d, %v", v, ok)
	}
	if hw.h.metrics[MetricSyncSuccesses] != 1 || hw.h.metrics[MetricVersion] != 1 ||
		hw.h.metrics[MetricLastSync] != uint64(e.clk.t.Unix()) {
		t.Errorf("holder metrics %v", hw.h.metrics)
	}
	// A 304 at the end of the wait polls again at once, with the same ETag.
	e.clk.advance(30 * time.Second)
	hw.h.respond(hw.h.lastCall(), "304", nil, "")
	if len(hw.h.calls) != 3 || hw.h.lastCall().header("if-none-match") != `"v1"` {
		t.Errorf("after 304: %d calls", len(hw.h.calls))
	}
	if hw.h.metrics[MetricSyncSuccesses] != 2 {
		t.Errorf("successes %d, want 2", hw.h.metrics[MetricSyncSuccesses])
	}
	e.tick()
	for _, w := range e.ws {
		if len(w.applied) != 1 {
			t.Errorf("a 304 re-applied the policy (%d applies)", len(w.applied))
		}
	}
}

func TestCheckIsThrottled(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.tick()
	hw := e.holder()
	other := e.ws[0]
	if other == hw {
		other = e.ws[1]
	}
	other.s.Check(nowOf(other.s)) // reads meta now
	hw.h.respond(hw.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	other.s.Check(nowOf(other.s)) // within RequestCheckInterval: no read
	if other.version() != 0 {
		t.Fatalf("Check applied within the throttle interval")
	}
	e.clk.advance(RequestCheckInterval)
	other.s.Check(nowOf(other.s))
	if other.version() != 1 {
		t.Fatalf("Check after the interval applied version %d, want 1", other.version())
	}
}

func TestInvalidPoliciesRejected(t *testing.T) {
	big := `{"policy":"default","version":9,"rules":[],"x":"` + strings.Repeat("a", rules.MaxPolicyBytes) + `"}`
	for _, tc := range []struct {
		name, body string
		kind       FailureKind
	}{
		{"truncated", policyDoc(2, 5)[:40], FailInvalidPolicy},
		{"not json", "<html>oops</html>", FailInvalidPolicy},
		{"empty", "", FailInvalidPolicy},
		{"invalid rule", `{"policy":"default","version":2,"rules":[{"id":"r","algorithm":"gcra","limit":0,"window":"1m"}]}`, FailInvalidPolicy},
		{"unknown field", `{"policy":"default","version":2,"rules":[],"colour":"red"}`, FailInvalidPolicy},
		{"other policy", `{"policy":"other","version":2,"rules":[]}`, FailInvalidPolicy},
		{"too large", big, FailTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2, nil)
			e.tick()
			hw := e.holder()
			hw.h.respond(hw.h.lastCall(), "200", etag(1), policyDoc(1, 10))
			calls := len(hw.h.calls)
			hw.h.respond(hw.h.lastCall(), "200", etag(2), tc.body)
			if hw.version() != 1 || len(hw.applied) != 1 {
				t.Fatalf("applied %d, version %d; want the last good (1)", len(hw.applied), hw.version())
			}
			if got := hw.h.metrics[MetricSyncFailuresPrefix+string(tc.kind)]; got != 1 {
				t.Errorf("%s failures = %d, want 1 (metrics %v)", tc.kind, got, hw.h.metrics)
			}
			if len(hw.h.logsWith("rejected")) != 1 {
				t.Errorf("logs %q: want one 'rejected' line", hw.h.logs)
			}
			// Backoff before the next poll (50 ms with the lowest jitter),
			// which then waits on the rejected ETag instead of refetching.
			if len(hw.h.calls) != calls {
				t.Fatalf("polled again at once after a rejection")
			}
			e.tick()
			if len(hw.h.calls) != calls+1 {
				t.Fatalf("%d calls after the backoff, want %d", len(hw.h.calls), calls+1)
			}
			if got := hw.h.lastCall().header("if-none-match"); got != `"v2"` {
				t.Errorf("if-none-match after rejection = %q, want \"v2\"", got)
			}
			meta, _, _ := e.st.get(MetaKey("default"))
			if m, _ := DecodeMeta(meta); m.Version != 1 {
				t.Errorf("published version %d, want 1", m.Version)
			}
			for _, w := range e.ws {
				w.s.Tick()
				if w.version() != 1 {
					t.Errorf("a worker has version %d", w.version())
				}
			}
		})
	}
}

func TestFailuresBackOffAndLogOncePerStateChange(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	w.h.respond(w.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	failures := []func(c *call){
		func(c *call) { w.h.reset(c) },
		func(c *call) { w.h.respond(c, "503", nil, "no healthy upstream") },
		func(c *call) { w.h.respond(c, "401", nil, "") },
		func(c *call) { w.h.respond(c, "504", nil, "gateway says no") },
		func(c *call) { w.h.reset(c) },
	}
	var gaps []int // ticks between failure and next call
	for _, f := range failures {
		n := len(w.h.calls)
		f(w.h.lastCall())
		ticks := 0
		for len(w.h.calls) == n {
			e.tick()
			ticks++
			if ticks > 1000 {
				t.Fatal("no retry within 1000 ticks")
			}
		}
		gaps = append(gaps, ticks)
	}
	// Lowest jitter: 50, 100, 200, 400, 800 ms → 1, 1, 2, 4, 8 ticks.
	want := []int{1, 1, 2, 4, 8}
	for i := range want {
		if gaps[i] != want[i] {
			t.Errorf("retry gaps in ticks = %v, want %v", gaps, want)
			break
		}
	}
	if got := w.h.logsWith("sync failing"); len(got) != 1 {
		t.Errorf("'sync failing' logged %d times, want once: %q", len(got), got)
	}
	if w.h.metrics[MetricSyncFailuresPrefix+"reset"] != 2 || w.h.metrics[MetricSyncFailuresPrefix+"http_status"] != 3 {
		t.Errorf("failure counters %v", w.h.metrics)
	}
	e.clk.advance(30 * time.Second)
	w.h.respond(w.h.lastCall(), "304", nil, "")
	if got := w.h.logsWith("sync recovered after 5 failed polls"); len(got) != 1 {
		t.Errorf("recovery logs %q", w.h.logs)
	}
	// The next failure starts from the smallest backoff again.
	n := len(w.h.calls)
	w.h.reset(w.h.lastCall())
	e.tick()
	if len(w.h.calls) != n+1 {
		t.Errorf("backoff not reset by the success")
	}
	if got := w.h.logsWith("sync failing"); len(got) != 2 {
		t.Errorf("'sync failing' logged %d times, want twice", len(got))
	}
	if w.version() != 1 {
		t.Errorf("version %d after failures, want 1", w.version())
	}
}

func TestTimeoutPollsAgainWithoutFailure(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	e.clk.advance(33 * time.Second)
	w.h.respond(w.h.lastCall(), "504", nil, "upstream request timeout")
	if len(w.h.calls) != 2 {
		t.Fatalf("%d calls after the timeout, want 2", len(w.h.calls))
	}
	for k, v := range w.h.metrics {
		if strings.HasPrefix(k, MetricSyncFailuresPrefix) && v != 0 {
			t.Errorf("timeout counted as failure: %s=%d", k, v)
		}
	}
}

func TestDispatchErrorBacksOff(t *testing.T) {
	e := newEnv(t, 1, nil)
	w := e.ws[0]
	w.h.dispatchErr = proxywasm.ErrBadArgument
	e.tick()
	e.tick()
	if w.h.metrics[MetricSyncFailuresPrefix+"dispatch"] != 2 {
		t.Errorf("dispatch failures %v", w.h.metrics)
	}
	if len(w.h.logsWith("sync failing (dispatch)")) != 1 {
		t.Errorf("logs %q", w.h.logs)
	}
}

func TestLeasePassesFromDeadHolder(t *testing.T) {
	e := newEnv(t, 4, func(o *Options) { o.Lease = time.Second })
	e.tick()
	dead := e.holder()
	dead.h.respond(dead.h.lastCall(), "200", etag(3), policyDoc(3, 10))
	var live []*worker
	for _, w := range e.ws {
		if w != dead {
			live = append(live, w)
		}
	}
	// The holder stops ticking (its VM died with its poll in flight).
	ticks := 0
	for {
		e.tick(live...)
		ticks++
		if len(e.holders()) == 2 {
			break
		}
		if ticks > 100 {
			t.Fatal("no new holder after 100 ticks")
		}
	}
	// Lease 1 s = 10 ticks: the lease lapses at the 10th tick after the
	// last renewal.
	if ticks != 10 {
		t.Errorf("lease passed after %d ticks, want 10", ticks)
	}
	var nw *worker
	for _, w := range live {
		if w.s.Holding() {
			nw = w
		}
	}
	c := nw.h.lastCall()
	if got := c.header("if-none-match"); got != `"v3"` {
		t.Errorf("new holder's if-none-match %q, want the published \"v3\"", got)
	}
	if got := len(nw.h.logsWith("took the sync lease")); got != 1 {
		t.Errorf("new holder logged 'took' %d times", got)
	}
	// The old holder's poll result arrives late: dropped, nothing changes.
	dead.s.holding = true // it still believes it holds the lease
	old := dead.h.calls[len(dead.h.calls)-1]
	dead.h.respond(old, "200", etag(4), policyDoc(4, 10))
	meta, _, _ := e.st.get(MetaKey("default"))
	if m, _ := DecodeMeta(meta); m.Version != 3 {
		t.Errorf("late result of a lost lease was published: version %d", m.Version)
	}
	if dead.s.Holding() || len(dead.h.logsWith("lost the sync lease")) != 1 {
		t.Errorf("old holder: holding %v, logs %q", dead.s.Holding(), dead.h.logs)
	}
}

func TestStopReleasesLease(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.tick()
	hw := e.holder()
	hw.s.Stop()
	var other *worker
	for _, w := range e.ws {
		if w != hw {
			other = w
		}
	}
	e.tick(other)
	if !other.s.Holding() {
		t.Fatal("the lease did not pass on the next tick after Stop")
	}
}

func TestFollowerOnlyNeverPolls(t *testing.T) {
	e := newEnv(t, 1, nil)
	follower := func() *worker {
		e.opts.Cluster = ""
		defer func() { e.opts.Cluster = "control_plane" }()
		return e.add()
	}()
	e.tick()
	if follower.s.Holding() || len(follower.h.calls) != 0 {
		t.Fatal("a follower-only Syncer took the lease or polled")
	}
	hw := e.ws[0]
	hw.h.respond(hw.h.lastCall(), "200", etag(1), policyDoc(1, 1))
	e.tick()
	if follower.version() != 1 {
		t.Errorf("follower version %d, want 1", follower.version())
	}
}

func TestLargePolicyChunked(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"policy":"default","version":5,"rules":[`)
	for i := range rules.MaxRules {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"r` + strconv.Itoa(i) + `","description":"` + strings.Repeat("d", rules.MaxDescriptionBytes) +
			`","algorithm":"token_bucket","limit":10,"window":"1s"}`)
	}
	b.WriteString(`]}`)
	doc := b.String()
	e := newEnv(t, 3, nil)
	e.tick()
	hw := e.holder()
	hw.h.respond(hw.h.lastCall(), "200", etag(5), doc)
	meta, _, _ := e.st.get(MetaKey("default"))
	m, ok := DecodeMeta(meta)
	if !ok || m.Chunks < 4 || int(m.Length) != len(doc) {
		t.Fatalf("meta %+v, %v; want %d bytes in ≥ 4 chunks", m, ok, len(doc))
	}
	e.tick()
	for _, w := range e.ws {
		if w.version() != 5 || w.applied[0].Len() != rules.MaxRules {
			t.Errorf("worker version %d", w.version())
		}
	}
	// A smaller next version goes to generation 2's own keys; once it is
	// committed, generation 1's chunks are shrunk to nothing (the keys
	// stay: shared data cannot delete).
	hw.h.respond(hw.h.lastCall(), "200", etag(6), policyDoc(6, 1))
	if v, _, err := e.st.get(ChunkKey("default", 2, 0)); err != nil || len(v) == 0 {
		t.Errorf("generation 2 was not written to its own keys: writes %v", e.st.writes)
	}
	for i := range int(m.Chunks) {
		if v, _, err := e.st.get(ChunkKey("default", 1, i)); err != nil || len(v) != 0 {
			t.Errorf("generation 1's chunk %d: %d bytes after generation 2 was committed, want 0 (%v)", i, len(v), err)
		}
	}
	e.tick()
	for _, w := range e.ws {
		if w.version() != 6 {
			t.Errorf("worker version %d, want 6", w.version())
		}
	}
}

func TestTornReadRetried(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.tick()
	hw := e.holder()
	follower := e.ws[0]
	if follower == hw {
		follower = e.ws[1]
	}
	hw.h.respond(hw.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	// Simulate generation 3 overwriting slot 1 between the follower's meta
	// read and its chunk reads: meta of generation 1, chunk of generation 3.
	key := ChunkKey("default", 1, 0)
	good, _, _ := e.st.get(key)
	_ = e.st.set(key, Chunks([]byte(policyDoc(3, 10)), 3)[0], 0)
	e.tick(follower)
	if follower.version() != 0 {
		t.Fatalf("a torn read was applied")
	}
	_ = e.st.set(key, good, 0)
	e.tick(follower)
	if follower.version() != 1 {
		t.Fatalf("version %d after the torn read healed, want 1", follower.version())
	}
}

func TestOlderVersionNotPublished(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	w.h.respond(w.h.lastCall(), "200", etag(5), policyDoc(5, 10))
	w.h.respond(w.h.lastCall(), "200", etag(4), policyDoc(4, 10))
	if w.version() != 5 || len(w.applied) != 1 {
		t.Errorf("version %d after an older one arrived, want 5", w.version())
	}
	if len(w.h.logsWith("below the published 5")) != 1 {
		t.Errorf("logs %q", w.h.logs)
	}
}

func TestUncompilablePublishedPolicySkippedOnce(t *testing.T) {
	e := newEnv(t, 1, func(o *Options) { o.Cluster = "" })
	w := e.ws[0]
	doc := []byte(`{"policy":"default","version":2,"rules":[],"bogus":1}`)
	m := Meta{Version: 2, Generation: 1, Claimed: 1, Length: uint32(len(doc)), Chunks: 1, Checksum: Checksum(doc)}
	_ = e.st.set(ChunkKey("default", 1, 0), Chunks(doc, 1)[0], 0)
	_ = e.st.set(MetaKey("default"), AppendMeta(nil, m), 0)
	for range 5 {
		e.tick()
	}
	if w.version() != 0 || len(w.h.logsWith("rejected")) != 1 {
		t.Errorf("version %d, logs %q", w.version(), w.h.logs)
	}
}

func TestStartAppliesPublished(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	e.ws[0].h.respond(e.ws[0].h.lastCall(), "200", etag(7), policyDoc(7, 10))
	late := e.add()
	if late.version() != 7 {
		t.Errorf("a worker started after publication has version %d, want 7", late.version())
	}
}

func TestNewErrors(t *testing.T) {
	apply := func(*rules.Compiled) error { return nil }
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"bad policy", Options{Policy: "Bad Name", Apply: apply}, "not a valid policy name"},
		{"no apply", Options{Policy: "p"}, "Apply is required"},
		{"timeout ≤ wait", Options{Policy: "p", Apply: apply, Wait: time.Second, Timeout: time.Second}, "must exceed wait"},
		{"lease < 2 ticks", Options{Policy: "p", Apply: apply, Tick: time.Second, Lease: time.Second}, "at least two ticks"},
		{"huge timeout", Options{Policy: "p", Apply: apply, Timeout: 1 << 62}, "exceeds 2^31-1 ms"},
		{"tiny wait", Options{Policy: "p", Apply: apply, Wait: time.Microsecond}, "below 1ms"},
	} {
		_, err := New(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	s, err := New(Options{Policy: "p", Apply: apply, Host: newFakeHost(t, newStore())})
	if err != nil {
		t.Fatal(err)
	}
	if s.o.Wait != 30*time.Second || s.o.Timeout != 33*time.Second || s.o.Lease != time.Second || s.VMToken() == 0 {
		t.Errorf("defaults: %+v token %d", s.o, s.VMToken())
	}
}

func TestNextLease(t *testing.T) {
	const me, other = 1, 2
	now := int64(1000)
	for _, tc := range []struct {
		name string
		cur  Lease
		take bool
	}{
		{"free", Lease{}, true},
		{"mine", Lease{Holder: me, ExpiryNanos: now + 5}, true},
		{"mine, expired", Lease{Holder: me, ExpiryNanos: now - 5}, true},
		{"other's, live", Lease{Holder: other, ExpiryNanos: now + 1}, false},
		{"other's, expiring now", Lease{Holder: other, ExpiryNanos: now}, true},
		{"other's, expired", Lease{Holder: other, ExpiryNanos: 1}, true},
	} {
		next, take := NextLease(tc.cur, me, now, 10)
		if take != tc.take {
			t.Errorf("%s: take %v, want %v", tc.name, take, tc.take)
		}
		if take && next != (Lease{Holder: me, ExpiryNanos: now + 10}) {
			t.Errorf("%s: next %+v", tc.name, next)
		}
	}
}

func TestMalformedLeaseTakenOver(t *testing.T) {
	e := newEnv(t, 1, nil)
	_ = e.st.set(LeaseKey("default"), []byte("garbage"), 0)
	e.tick()
	if !e.ws[0].s.Holding() {
		t.Error("a malformed lease was not taken over")
	}
}

func TestLeaseKeyCreatedAtStart(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.add()
	v, _, err := e.st.get(LeaseKey("default"))
	if l, ok := DecodeLease(v); err != nil || !ok || l != (Lease{}) {
		t.Errorf("lease after Start: %v %+v %v", err, l, ok)
	}
	if e.ws[0].s.Holding() {
		t.Error("Start took the lease (the canary must not)")
	}
	// The meta key is created too, empty (nothing published), so that
	// every later write to it is a compare-and-swap.
	if v, _, err := e.st.get(MetaKey("default")); err != nil || len(v) != 0 {
		t.Errorf("meta after Start: %v, %d bytes; want it created empty", err, len(v))
	}
}

func TestCheckHookRejects(t *testing.T) {
	e := newEnv(t, 2, func(o *Options) {
		o.Check = func(c *rules.Compiled) error {
			if c.Rule(0).Rule.Limit > 100 {
				return errors.New("rule r does not fit the bucket layout")
			}
			return nil
		}
	})
	e.tick()
	hw := e.holder()
	hw.h.respond(hw.h.lastCall(), "200", etag(1), policyDoc(1, 1000))
	if hw.version() != 0 || hw.h.metrics[MetricSyncFailuresPrefix+"invalid_policy"] != 1 {
		t.Errorf("version %d, metrics %v", hw.version(), hw.h.metrics)
	}
	if v, _, _ := e.st.get(MetaKey("default")); len(v) != 0 {
		t.Error("a policy refused by Check was published")
	}
	if len(hw.h.logsWith("does not fit")) != 1 {
		t.Errorf("logs %q", hw.h.logs)
	}
}

func TestApplyErrorKeepsPrevious(t *testing.T) {
	e := newEnv(t, 1, nil)
	w := e.ws[0]
	e.tick()
	w.h.respond(w.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	// A second plugin instance whose Apply refuses everything.
	e.opts.Cluster = ""
	refuser := e.add()
	if refuser.version() != 1 {
		t.Fatalf("version %d", refuser.version())
	}
	refuser.s.o.Apply = func(*rules.Compiled) error { return errors.New("no room") }
	w.h.respond(w.h.lastCall(), "200", etag(2), policyDoc(2, 10))
	for range 3 {
		e.tick()
	}
	if v, _ := refuser.s.Version(); v != 1 || len(refuser.h.logsWith("no room")) != 1 {
		t.Errorf("version %d, logs %q", v, refuser.h.logs)
	}
}

func TestEarlyNoChangeAnswersSpaced(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	w.h.respond(w.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	// A proxy that ignores ?wait answers 304 at once: the next poll waits
	// for MinPollSpacing, driven by the tick.
	w.h.respond(w.h.lastCall(), "304", nil, "")
	if len(w.h.calls) != 2 {
		t.Fatalf("%d calls after instant 304s, want 2 (the 304 deferred the next)", len(w.h.calls))
	}
	ticks := 0
	for len(w.h.calls) == 2 {
		e.tick()
		ticks++
	}
	if time.Duration(ticks)*e.opts.Tick != MinPollSpacing {
		t.Errorf("next poll after %d ticks, want %v", ticks, MinPollSpacing)
	}
	// A change answered at once is followed at once.
	w.h.respond(w.h.lastCall(), "200", etag(2), policyDoc(2, 10))
	if len(w.h.calls) != 4 {
		t.Errorf("%d calls after a quick change, want 4", len(w.h.calls))
	}
}

// TestFailedPublishRefetched: a 200 whose policy could not be published
// (the meta's compare-and-swap kept failing) must be fetched again after
// the backoff, not answered 304 because its ETag was already sent as
// If-None-Match.
func TestFailedPublishRefetched(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	w.h.respond(w.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	w.h.setErr = func(key string) error {
		if key == MetaKey("default") {
			return proxywasm.ErrCasMismatch
		}
		return nil
	}
	w.h.respond(w.h.lastCall(), "200", etag(2), policyDoc(2, 10))
	w.h.setErr = nil
	if w.version() != 1 {
		t.Fatalf("version %d applied although publishing failed", w.version())
	}
	n := len(w.h.calls)
	for i := 0; i < 100 && len(w.h.calls) == n; i++ {
		e.tick()
	}
	if len(w.h.calls) == n {
		t.Fatal("no poll after the failed publication")
	}
	if got := w.h.lastCall().header("if-none-match"); got == `"v2"` {
		t.Fatalf("the retry sent If-None-Match %s: the control plane answers 304 and version 2 is never published", got)
	}
}

// TestPrepareRunsBeforePublish: the holder runs Prepare on a new policy
// before its meta is published (so the plugin's counter keys exist before
// any worker applies it), and a Prepare error leaves it unpublished and
// fetched again after the backoff.
func TestPrepareRunsBeforePublish(t *testing.T) {
	var e *env
	var prepared []uint64
	fail := false
	e = newEnv(t, 2, func(o *Options) {
		o.Prepare = func(c *rules.Compiled) error {
			if val, _, err := e.ws[0].h.GetSharedData(MetaKey("default")); err == nil {
				if m, ok := DecodeMeta(val); ok && m.Version >= c.Version {
					t.Errorf("Prepare(version %d) ran after version %d was published", c.Version, m.Version)
				}
			}
			for _, w := range e.ws {
				if w.version() >= c.Version {
					t.Errorf("Prepare(version %d) ran after a worker applied it", c.Version)
				}
			}
			prepared = append(prepared, c.Version)
			if fail {
				return errors.New("shared data unavailable")
			}
			return nil
		}
	})
	e.tick()
	w := e.ws[0]
	if !w.s.Holding() {
		w = e.ws[1]
	}
	w.h.respond(w.h.lastCall(), "200", etag(1), policyDoc(1, 10))
	e.tick()
	for i, x := range e.ws {
		if x.version() != 1 {
			t.Fatalf("worker %d: version %d, want 1", i, x.version())
		}
	}
	fail = true
	w.h.respond(w.h.lastCall(), "200", etag(2), policyDoc(2, 10))
	fail = false
	n := len(w.h.calls)
	e.tick()
	for i, x := range e.ws {
		if x.version() != 1 {
			t.Fatalf("worker %d: version %d applied although Prepare failed", i, x.version())
		}
	}
	for i := 0; i < 100 && len(w.h.calls) == n; i++ {
		e.tick()
	}
	if len(w.h.calls) == n {
		t.Fatal("no poll after the failed Prepare")
	}
	if got := w.h.lastCall().header("if-none-match"); got == `"v2"` {
		t.Fatalf("the retry sent If-None-Match %s: version 2 would never be published", got)
	}
	if fmt.Sprint(prepared) != "[1 2]" {
		t.Fatalf("Prepare ran for versions %v, want [1 2]", prepared)
	}
}

// TestDeletedPolicyIsDroppedByEveryWorker: a 404 naming the deletion (the
// control plane's tag of the deleted version) is published like a new version:
// every worker applies "no policy", a later version takes over again, and a 404
// without a tag (no such policy ever, or another server) keeps the last policy.
func TestDeletedPolicyIsDroppedByEveryWorker(t *testing.T) {
	e := newEnv(t, 3, nil)
	e.tick()
	hw := e.holder()
	tag := func(v int, sum string) [][2]string {
		return [][2]string{{"etag", `"v` + strconv.Itoa(v) + `.ep1.` + sum + `"`}}
	}
	hw.h.respond(hw.h.lastCall(), "200", tag(1, "aa"), policyDoc(1, 10))
	e.clk.advance(RequestCheckInterval)
	for _, w := range e.ws {
		w.s.Check(nowOf(w.s))
	}
	// A 404 without a tag: a failure, the policy stays.
	hw.h.respond(hw.h.lastCall(), "404", nil, `{"error":{"code":"not_found"}}`)
	e.clk.advance(10 * time.Second)
	e.tick()
	for _, w := range e.ws {
		if len(w.applied) != 1 || w.applied[0] == nil {
			t.Fatalf("a 404 without a tag changed the policy: %d applies", len(w.applied))
		}
	}
	if hw.h.metrics[MetricSyncFailuresPrefix+string(FailHTTPStatus)] == 0 {
		t.Fatalf("a 404 without a tag was not counted as a failure: %v", hw.h.metrics)
	}
	// The deletion, version 2.
	for i := 0; i < 100 && len(hw.h.calls) == 0; i++ {
		e.tick()
	}
	hw = e.holder()
	hw.h.respond(hw.h.lastCall(), "404", tag(2, ""), `{"error":{"code":"not_found"}}`)
	e.clk.advance(RequestCheckInterval)
	for _, w := range e.ws {
		w.s.Check(nowOf(w.s))
		if n := len(w.applied); n != 2 || w.applied[1] != nil {
			t.Fatalf("worker after the deletion: %d applies, last %v; want the deletion (nil)", n, w.applied[n-1])
		}
		if v, ok := w.s.Version(); !ok || v != 2 {
			t.Fatalf("Version() = %d, %v after the deletion at 2", v, ok)
		}
	}
	if got := hw.h.lastCall().header("if-none-match"); got != `"v2.ep1."` {
		t.Fatalf("next poll names %q, want the deletion's tag", got)
	}
	// The same deletion again changes nothing; a re-created version 3 applies.
	e.clk.advance(30 * time.Second)
	hw.h.respond(hw.h.lastCall(), "404", tag(2, ""), `{"error":{"code":"not_found"}}`)
	hw.h.respond(hw.h.lastCall(), "200", tag(3, "bb"), policyDoc(3, 20))
	e.clk.advance(RequestCheckInterval)
	for _, w := range e.ws {
		w.s.Check(nowOf(w.s))
		if n := len(w.applied); n != 3 || w.applied[2] == nil || w.applied[2].Version != 3 {
			t.Fatalf("worker after re-creation: %d applies", n)
		}
	}
	// A worker started after the deletion was published applies it at start.
	e2 := newEnv(t, 1, nil)
	e2.tick()
	h2 := e2.holder()
	h2.h.respond(h2.h.lastCall(), "404", tag(5, ""), "")
	late := e2.add()
	if len(late.applied) != 1 || late.applied[0] != nil {
		t.Fatalf("a worker starting after the deletion: %d applies", len(late.applied))
	}
}

// TestSyncCountersExistBeforeTheFirstFailure: every sync counter is defined
// (at 0) when the syncer starts, so a dashboard or an alert on the failures
// reads 0 rather than no series until the first failure.
func TestSyncCountersExistBeforeTheFirstFailure(t *testing.T) {
	e := newEnv(t, 1, nil)
	h := e.ws[0].h
	names := []string{MetricSyncSuccesses}
	for _, k := range FailureKinds {
		names = append(names, MetricSyncFailuresPrefix+string(k))
	}
	for _, n := range names {
		if _, ok := h.metrics[n]; !ok {
			t.Errorf("%s is not defined after Start", n)
		}
	}
}

// nowOf is what the request path passes to Check: s's clock now.
func nowOf(s *Syncer) int64 { return s.nowNanos() }
