package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
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

// TestFullLedgerOfEmptyEntriesGivesWay: a ledger full of entries that hold no units
// (made-up ids that asked once and gave their unit back) never keeps a newcomer out
// of a key whose budget remains: it is answered retry, never refused, and the sweep
// that its retry starts removes the empty entries before its next ask.
func TestFullLedgerOfEmptyEntriesGivesWay(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	p.set(t, strings.Replace(testPolicyDoc, `"id":"fw","algorithm":"fixed_window","limit":1000`,
		`"id":"fw","algorithm":"fixed_window","limit":100000000`, 1))
	s := newService(t, NewMemory(), p, clk)
	const maxEntries = 64
	s.o.MaxEntriesPerKey = maxEntries
	key := globalKey("fw")
	es := newEnvoys(maxEntries + 1)
	for _, e := range es[:maxEntries] {
		if r := ask(t, s, e, "fw", key, 0, 0, 1); r.Granted != 1 {
			t.Fatalf("%+v", r)
		}
		if r := ask(t, s, e, "fw", key, 0, 1, 0); r.Held != 0 {
			t.Fatalf("after the return: %+v", r)
		}
	}
	if r := ask(t, s, es[maxEntries], "fw", key, 0, 0, 5); r.Status != quota.StatusRetry {
		t.Fatalf("a newcomer on a ledger full of empty entries: %+v, want retry", r)
	}
	if r := ask(t, s, es[maxEntries], "fw", key, 0, 0, 5); r.Status != quota.StatusGranted || r.Granted != 5 {
		t.Fatalf("the newcomer asking again: %+v", r)
	}
}

// TestFullLedgerOfQuietLeasesGivesWay: a ledger full of live leases whose Envoys
// stopped reporting (made-up ids that asked once, pods gone in a rollout) keeps a
// newcomer waiting only while they count as active (three report intervals of at
// least 5 s); then
// the least recent gives way, its units still counted, and the window never grants
// more than the limit.
func TestFullLedgerOfQuietLeasesGivesWay(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	const lim = 100000
	p.set(t, strings.Replace(testPolicyDoc, `"id":"fw","algorithm":"fixed_window","limit":1000`,
		`"id":"fw","algorithm":"fixed_window","limit":`+strconv.Itoa(lim), 1))
	s := newService(t, NewMemory(), p, clk)
	const maxEntries = 64
	s.o.MaxEntriesPerKey = maxEntries
	key := globalKey("fw")
	es := newEnvoys(maxEntries + 1)
	var total uint64
	for _, e := range es[:maxEntries] {
		total += ask(t, s, e, "fw", key, 0, 0, 1).Granted
	}
	newcomer := es[maxEntries]
	if r := ask(t, s, newcomer, "fw", key, 0, 0, 5); r.Status != quota.StatusRetry {
		t.Fatalf("a newcomer while every lease is active: %+v, want retry", r)
	}
	clk.add(16 * time.Second) // past three report intervals (of at least 5 s, retainFor), within the minute
	r := ask(t, s, newcomer, "fw", key, 0, 0, 5)
	if r.Status != quota.StatusGranted || r.Granted != 5 {
		t.Fatalf("a newcomer once the others went quiet: %+v", r)
	}
	total += r.Granted
	for i := 0; i < 50; i++ {
		total += ask(t, s, newcomer, "fw", key, 0, 0, lim).Granted
	}
	if total > lim {
		t.Fatalf("%d units granted in one window, limit %d", total, lim)
	}
}

// TestFullLedgerKeepsTheKeysState: an Envoy answered retry because the key's ledger
// is full (MaxEnvoysPerKey Envoys hold live leases) must leave the key's stored value
// as it was, with its expiry: the units the others hold stay counted.
func TestFullLedgerKeepsTheKeysState(t *testing.T) {
	for _, bk := range singleBackends {
		t.Run(bk.name, func(t *testing.T) {
			b, _, client, _ := bk.open(t)
			clk := &clock{}
			clk.set(base() + int64(time.Second))
			p := newPolicies(t)
			// A limit above the ledger's size: every Envoy of a full ledger holds a unit.
			const maxEntries = 256
			const lim = 2 * maxEntries
			p.set(t, strings.Replace(testPolicyDoc, `"id":"fw","algorithm":"fixed_window","limit":1000`,
				`"id":"fw","algorithm":"fixed_window","limit":`+strconv.Itoa(lim), 1))
			s := newService(t, b, p, clk)
			s.o.MaxEntriesPerKey = maxEntries
			key := globalKey("fw")
			es := newEnvoys(maxEntries + 1)
			var total uint64
			for _, e := range es[:maxEntries] {
				total += ask(t, s, e, "fw", key, 0, 0, 1).Granted
			}
			if total != maxEntries {
				t.Fatalf("%d Envoys asking 1 unit each got %d", maxEntries, total)
			}
			if r := ask(t, s, es[maxEntries], "fw", key, 0, 0, 1); r.Status != quota.StatusRetry || r.Granted != 0 {
				t.Fatalf("Envoy %d on a full ledger: %+v", maxEntries+1, r)
			}
			skey := storageKey(t, s, p, "fw", key)
			if client != nil {
				if ttl := client.PTTL(context.Background(), skey).Val(); ttl < ttlSlack/2 {
					t.Fatalf("after the retry the key expires in %v", ttl)
				}
			} else {
				m := b.(*Memory)
				m.Now = func() time.Time { return time.Now().Add(time.Second) }
				snaps, _ := m.Load(context.Background(), []Read{{Key: skey}})
				m.Now = nil
				if snaps[0].Header == nil {
					t.Fatal("after the retry the key's value is gone")
				}
			}
			for i := 0; i < 100; i++ {
				total += ask(t, s, es[0], "fw", key, 0, 0, lim).Granted
			}
			if total > lim {
				t.Fatalf("%d units granted in one window, limit %d", total, lim)
			}
		})
	}
}

// FuzzQuotaHandler: any body is answered 200, 400 or 413 with a JSON body, never a
// panic or a 500.
func FuzzQuotaHandler(f *testing.F) {
	for _, s := range []string{okBody, `{}`, `[]`, `{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"keyed","key":"rl:default:p/keyed:ip=1:60s","used":1,"return":5,"want":1099511627776}]}`,
		`{"envoy":"e","policy":"p","version":1,"env":"t","interval":"10ms","keys":[{"rule":"tb","key":"rl:t:p/tb:*:60s","return":3,"want":3},{"rule":"gc","key":"rl:t:p/gc:*:60s","want":1000},{"rule":"tw","key":"rl:t:p/tw:*:60s","want":1}]}`} {
		f.Add([]byte(s))
	}
	clk := &clock{}
	clk.set(base())
	s := New(Options{Backend: NewMemory(), Policies: newPolicies(f), Open: true, Now: clk.Now})
	f.Fuzz(func(t *testing.T, body []byte) {
		clk.add(time.Millisecond)
		rec := httptest.NewRecorder()
		hr := httptest.NewRequest(http.MethodPost, "/v1/quota", bytes.NewReader(body))
		hr.Header.Set("Content-Type", "application/json")
		s.ServeHTTP(rec, hr)
		switch rec.Code {
		case http.StatusOK:
			if _, err := quota.DecodeResponse(rec.Body.Bytes()); err != nil {
				t.Fatalf("200 with a body that does not decode: %v", err)
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var eb errBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" {
				t.Fatalf("%d with body %s", rec.Code, rec.Body)
			}
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
	})
}

// bucketPropertyDoc has bucket rules of several shapes, for the spending property.
const bucketPropertyDoc = `{"policy":"r","version":1,"rules":[
 {"id":"tb","algorithm":"token_bucket","limit":1000,"window":"1m","scope":"fleet"},
 {"id":"tbs","algorithm":"token_bucket","limit":10,"burst":20,"window":"1s","scope":"fleet"},
 {"id":"gc","algorithm":"gcra","limit":1000,"burst":100,"window":"1m","scope":"fleet"},
 {"id":"gcs","algorithm":"gcra","limit":5,"burst":3,"window":"1s","scope":"fleet"}]}`

// TestBucketSpendingNeverExceedsTheRule simulates honest Envoys on token_bucket and
// gcra keys: each spends units of its lease at random times before the lease ends
// (as the answer gave it) and returns random parts of what it has not spent. Over
// every interval [a, b] the units spent across the fleet must stay within the rule's
// own bound, capacity + limit·(b-a)/window.
func TestBucketSpendingNeverExceedsTheRule(t *testing.T) {
	type rc struct {
		id, period    string
		capacity, lim uint64
		window        time.Duration
	}
	for _, r := range []rc{{"tb", "60", 1000, 1000, time.Minute}, {"tbs", "1", 20, 10, time.Second},
		{"gc", "60", 101, 1000, time.Minute}, {"gcs", "1", 4, 5, time.Second}} {
		for seed := uint64(1); seed <= 40; seed++ {
			p := &policies{m: map[string]store.Record{}}
			p.set(t, bucketPropertyDoc)
			clk := &clock{}
			clk.set(base())
			s := New(Options{Backend: NewMemory(), Policies: p, Open: true, Now: clk.Now})
			key := "rl:" + testEnv + ":r/" + r.id + ":*:" + r.period + "s"
			rng := rand.New(rand.NewPCG(seed, 99))
			type ev struct {
				at int64
				n  uint64
			}
			var spent []ev
			type env struct {
				avail, used uint64
				exp         int64
			}
			es := make([]env, 4)
			for op := 0; op < 3000; op++ {
				// Time moves by up to a fifth of the window, sometimes not at all.
				if rng.IntN(3) == 0 {
					clk.add(time.Duration(rng.Int64N(int64(r.window) / 5)))
				}
				now := clk.Now()
				i := rng.IntN(len(es))
				e := &es[i]
				if now >= e.exp {
					e.avail = 0
				}
				if e.avail > 0 && rng.IntN(2) == 0 {
					n := 1 + rng.Uint64N(e.avail)
					e.avail -= n
					e.used += n
					spent = append(spent, ev{now, n})
					continue
				}
				var ret uint64
				if e.avail > 0 && rng.IntN(3) == 0 {
					ret = 1 + rng.Uint64N(e.avail)
					e.avail -= ret
				}
				resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "e" + strconv.Itoa(i), Policy: "r", Version: 1, Env: testEnv,
					Interval: time.Second, Keys: []quota.KeyRequest{{Rule: r.id, Key: key, Used: e.used, Return: ret, Want: 1 + rng.Uint64N(r.capacity)}}})
				if err != nil {
					t.Fatal(err)
				}
				e.used = 0
				k := resp.Keys[0]
				if k.Status == quota.StatusBadKey || k.Status == quota.StatusNotFleet {
					t.Fatalf("%s: %+v", r.id, k)
				}
				if k.Granted > 0 && k.Held <= k.Granted {
					// A lease of its own (the filter's fresh grant): what the
					// Envoy still had is given up.
					e.avail = 0
				}
				e.avail += k.Granted
				if k.Held > 0 {
					e.exp = resp.Now + int64(k.ExpiresIn)
				}
				if e.avail > k.Held {
					t.Fatalf("%s seed %d: the Envoy has %d unspent units, the service counts %d held", r.id, seed, e.avail, k.Held)
				}
			}
			for a := range spent {
				var sum uint64
				for b := a; b < len(spent); b++ {
					sum += spent[b].n
					span := uint64(spent[b].at - spent[a].at)
					hi, lo := bits.Mul64(r.lim, span)
					bhi, blo := bits.Mul64(r.capacity, uint64(r.window))
					blo, c := bits.Add64(blo, lo, 0)
					bhi += hi + c
					shi, slo := bits.Mul64(sum, uint64(r.window))
					if shi > bhi || (shi == bhi && slo > blo) {
						t.Fatalf("%s seed %d: %d units spent in %v, bound %d + %d per %v", r.id, seed, sum, time.Duration(span), r.capacity, r.lim, r.window)
					}
				}
			}
		}
	}
}

// TestReplicaClockSkewDoesNotResetTheBucket: two replicas whose clocks differ by a
// few milliseconds (ordinary NTP skew) share a token_bucket or gcra key whose whole
// capacity refills faster than that. The replica behind must not read the state the
// other wrote as a past, full bucket (nor the one ahead read the other's): over a
// span t of the leading clock the fleet is granted at most capacity + limit·(t +
// skew)/window.
func TestReplicaClockSkewDoesNotResetTheBucket(t *testing.T) {
	for _, c := range []struct {
		rule     string
		skew     time.Duration
		capacity uint64
		perMs    float64 // limit per millisecond
	}{
		{`{"id":"g","algorithm":"gcra","limit":1000,"burst":1,"window":"1s","scope":"fleet"}`, 3 * time.Millisecond, 2, 1},
		{`{"id":"g","algorithm":"token_bucket","limit":100,"window":"1s","scope":"fleet"}`, 2 * time.Second, 100, 0.1},
	} {
		p := &policies{m: map[string]store.Record{}}
		p.set(t, `{"policy":"s","version":1,"rules":[`+c.rule+`]}`)
		ahead, behind := &clock{}, &clock{}
		b := NewMemory()
		svcs := []*Service{
			New(Options{Backend: b, Policies: p, Open: true, Now: ahead.Now}),
			New(Options{Backend: b, Policies: p, Open: true, Now: behind.Now}),
		}
		start := base()
		const asks = 2000
		step := 10 * time.Microsecond
		var total uint64
		for i := 0; i < asks; i++ {
			ahead.set(start + int64(i)*int64(step))
			behind.set(ahead.Now() - int64(c.skew))
			resp, err := svcs[i%2].Handle(context.Background(), &quota.Request{Envoy: "e" + strconv.Itoa(i%4), Policy: "s", Version: 1,
				Env: testEnv, Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "g", Key: "rl:" + testEnv + ":s/g:*:1s", Want: 5}}})
			if err != nil {
				t.Fatal(err)
			}
			total += resp.Keys[0].Granted
		}
		span := time.Duration(asks) * step
		bound := float64(c.capacity) + c.perMs*float64(span+c.skew)/float64(time.Millisecond)
		if float64(total) > bound {
			t.Errorf("%s, replica clocks %v apart: %d units granted over %v, bound %.0f", c.rule, c.skew, total, span, bound)
		}
	}
}

// TestKeyClockRunsAtMostMaxSkewAheadOfTheReplica: a key's ledger holds reports from
// replicas 9 s and 18 s ahead of this one. The key's clock may run ahead of this
// replica's by maxSkew (10 s) and no more: the replica decides at its own time +
// 10 s, not at +18 s by stepping from one report to the next.
func TestKeyClockRunsAtMostMaxSkewAheadOfTheReplica(t *testing.T) {
	p := newPolicies(t)
	b := NewMemory()
	w := base() // a window of rule fw (1m) starts here
	own, at9, at18 := &clock{}, &clock{}, &clock{}
	own.set(w + int64(time.Second))
	at9.set(own.Now() + int64(9*time.Second))
	at18.set(own.Now() + int64(18*time.Second))
	for i, clk := range []*clock{at9, at18, own} {
		s := New(Options{Backend: b, Policies: p, Open: true, Now: clk.Now})
		resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "e" + strconv.Itoa(i), Policy: "p", Version: 1,
			Env: testEnv, Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.Keys[0]
		if clk != own {
			continue
		}
		// The lease ends with the window, at w+60s; decided at own+maxSkew = w+11s.
		if want := time.Duration(w + int64(time.Minute) - (own.Now() + int64(maxSkew))); r.ExpiresIn != want {
			t.Fatalf("lease expires in %v, want %v: the key's clock ran %v ahead of the replica's, at most %v allowed",
				r.ExpiresIn, want, time.Duration(w+int64(time.Minute)-int64(r.ExpiresIn)-own.Now()), maxSkew)
		}
	}
}
