package quota

import (
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// keyLedger reads the header of counter key under rule of the test policy and
// the number of entry fields the backend holds for it.
func keyLedger(t *testing.T, s *Service, b Backend, p *policies, rule, key string) (header, int) {
	t.Helper()
	rec, _ := p.Get("p")
	c, err := s.compile(rec, testEnv)
	if err != nil {
		t.Fatal(err)
	}
	ri := c.byID[rule]
	snaps, err := b.Load(context.Background(), []Read{{Key: c.pfx[ri] + key, Scan: Scan{Count: 1 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(snaps[0].Header, c.fleet[ri].lim.StateSize())
	if err != nil {
		t.Fatal(err)
	}
	fields := 0
	for cur := snaps[0]; ; {
		for _, f := range cur.Scanned {
			if strings.HasPrefix(f.Name, entryPrefix) {
				fields++
			}
		}
		if cur.Cursor == "" {
			break
		}
		next, err := b.Load(context.Background(), []Read{{Key: c.pfx[ri] + key, Scan: Scan{Cursor: cur.Cursor, Count: 1 << 20}}})
		if err != nil {
			t.Fatal(err)
		}
		cur = next[0]
	}
	return h, fields
}

// TestGoneEnvoysGiveTheirSlotsBack: a rollout replaces every Envoy of a key; the
// old ones stop reporting. Their entries are forgotten by the sweep within a few
// minutes, the ledger holds about the new fleet again, and a key whose ledger is
// bounded never keeps the new fleet out for long: every new Envoy is granted.
func TestGoneEnvoysGiveTheirSlotsBack(t *testing.T) {
	for _, bk := range singleBackends {
		t.Run(bk.name, func(t *testing.T) {
			b, _, _, _ := bk.open(t)
			clk := &clock{}
			clk.set(base() + int64(time.Second))
			p := newPolicies(t)
			p.set(t, strings.Replace(testPolicyDoc, `"id":"fw","algorithm":"fixed_window","limit":1000`,
				`"id":"fw","algorithm":"fixed_window","limit":100000000`, 1))
			s := newService(t, b, p, clk)
			const fleet = 200
			s.o.MaxEntriesPerKey = fleet + fleet/2 // room for half a rollout at once
			key := globalKey("fw")
			old, next := make([]*envoy, fleet), make([]*envoy, fleet)
			for i := range old {
				old[i] = &envoy{id: i, name: "old-" + strconv.Itoa(i)}
				next[i] = &envoy{id: i, name: "new-" + strconv.Itoa(i)}
			}
			for sec := 0; sec < 10; sec++ {
				for _, e := range old {
					if r := ask(t, s, e, "fw", key, 0, 0, 5); r.Granted == 0 {
						t.Fatalf("old Envoy %s at %d s: %+v", e.name, sec, r)
					}
				}
				clk.add(time.Second)
			}
			if h, n := keyLedger(t, s, b, p, "fw", key); h.count != fleet || n != fleet {
				t.Fatalf("before the rollout: header counts %d entries, %d stored; want %d", h.count, n, fleet)
			}
			// The rollout: the old Envoys are gone, the new ones report every second.
			granted := map[string]bool{}
			retries := 0
			for sec := 0; sec < 180; sec++ {
				for _, e := range next {
					r := ask(t, s, e, "fw", key, 0, 0, 5)
					switch r.Status {
					case quota.StatusRetry:
						retries++
					case quota.StatusGranted, quota.StatusPartial:
						granted[e.name] = true
					default:
						t.Fatalf("new Envoy %s at %d s: %+v", e.name, sec, r)
					}
				}
				clk.add(time.Second)
			}
			if len(granted) != fleet {
				t.Fatalf("%d of %d new Envoys were ever granted", len(granted), fleet)
			}
			h, n := keyLedger(t, s, b, p, "fw", key)
			if h.count != fleet || n != fleet {
				t.Fatalf("3 minutes after the rollout: header counts %d entries, %d stored; want %d (the old ones forgotten)", h.count, n, fleet)
			}
			if all, _ := h.ring.active(h.latest, retainFor(time.Second)); all != fleet {
				t.Fatalf("%d Envoys active, want %d", all, fleet)
			}
			t.Logf("%d new Envoys all granted; %d asks answered retry while the ledger was full; ledger back to %d entries", fleet, retries, n)
		})
	}
}

// TestHeaderRoundTrips: the header, activity ring included, decodes to what was
// encoded; a header of another state size or a stray byte does not decode.
func TestHeaderRoundTrips(t *testing.T) {
	h := header{state: []byte{1, 2, 3, 4, 5, 6, 7, 8}, total: 7, latest: 9e18, maxExp: 5, writes: 3, count: 4, heldSum: 11, winTag: 12, grantedA: 13}
	h.ring.add(int64(100*ringSlot), false)
	h.ring.add(int64(130*ringSlot), true)
	h.ring.add(int64(164*ringSlot), false)
	enc := h.encode(nil)
	got, err := decodeHeader(enc, 8)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.state) != string(h.state) || got.total != 7 || got.latest != 9e18 || got.count != 4 || got.heldSum != 11 || got.grantedA != 13 || got.ring != h.ring {
		t.Fatalf("decoded %+v, want %+v", got, h)
	}
	// Slot 100 fell out of the ring when it advanced to 164.
	if all, asg := got.ring.active(int64(164*ringSlot), int64(time.Hour)); all != 2 || asg != 1 {
		t.Fatalf("active %d (assignments %d), want 2 (1)", all, asg)
	}
	if _, err := decodeHeader(enc, 9); err == nil {
		t.Fatal("a header of another state size decoded")
	}
	if _, err := decodeHeader(append(enc, 0), 8); err == nil {
		t.Fatal("a header with a stray byte decoded")
	}
	// The ring's newest slot, bytes 71..79 after an 8-byte state, made negative:
	// its slots would index the ring below 0.
	neg := append([]byte(nil), enc...)
	binary.LittleEndian.PutUint64(neg[71:], uint64(1<<64-1))
	if _, err := decodeHeader(neg, 8); err == nil {
		t.Fatal("a header with a negative ring slot decoded")
	}
}

// TestHeaderRoundTripsEveryRingState: a header decodes to what was encoded
// whatever its activity ring holds (nothing, one slot, every slot) and whatever its
// numbers (zero, the largest), and the fixed part after the limiter state is
// exactly headerFixedSize bytes plus 9 per non-zero slot.
func TestHeaderRoundTripsEveryRingState(t *testing.T) {
	full := activity{at: 1000}
	for i := range full.all {
		full.all[i], full.asg[i] = uint32(i+1), uint32(i)
	}
	one := activity{at: 7}
	one.add(int64(7*ringSlot), true)
	cases := []struct {
		name  string
		h     header
		slots int
	}{
		{"empty ring, zero values", header{state: make([]byte, 8)}, 0},
		{"empty ring, ring advanced", header{state: make([]byte, 8), ring: activity{at: 5000}, count: 3, heldSum: 9}, 0},
		{"one slot", header{state: []byte{1, 2, 3, 4, 5, 6, 7, 8}, ring: one, total: 1}, 1},
		{"every slot", header{state: make([]byte, 8), ring: full}, ringSlots},
		{"largest values", header{state: []byte{255, 255, 255, 255, 255, 255, 255, 255}, total: 1<<64 - 1, latest: 1<<63 - 1,
			maxExp: 1<<63 - 1, writes: 1<<64 - 1, count: 1<<32 - 1, heldSum: 1<<64 - 1, winTag: 1<<64 - 1, grantedA: 1<<64 - 1,
			ring: activity{at: 1<<63 - 1}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			enc := c.h.encode(nil)
			if want := 3 + len(c.h.state) + headerFixedSize + 9*c.slots; len(enc) != want {
				t.Fatalf("encoded %d bytes, want %d", len(enc), want)
			}
			got, err := decodeHeader(enc, len(c.h.state))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, c.h) {
				t.Fatalf("decoded %+v\nwant    %+v", got, c.h)
			}
			for cut := 1; cut < len(enc); cut++ {
				if _, err := decodeHeader(enc[:cut], len(c.h.state)); err == nil {
					t.Fatalf("the first %d of %d bytes decoded", cut, len(enc))
				}
			}
		})
	}
}

// TestAHeaderThatDoesNotDecodeFailsTheRound: a key whose stored header is
// present but does not decode is not read as a fresh key (that would grant its
// limit again over the leases already out): the ask fails as the store's would
// (ErrUnavailable, answered 503), nothing is granted or written, and it is counted.
func TestAHeaderThatDoesNotDecodeFailsTheRound(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	mem := NewMemory()
	reg := prometheus.NewRegistry()
	s := New(Options{Backend: mem, Policies: newPolicies(t), Open: true, Now: clk.Now, Registry: reg})
	askFW := func(want uint64) (*quota.Response, error) {
		return s.Handle(context.Background(), &quota.Request{Envoy: "e", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
			Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: want}}})
	}
	if resp, err := askFW(600); err != nil || resp.Keys[0].Granted == 0 {
		t.Fatalf("first grant: %+v %v", resp, err)
	}
	if len(mem.m) != 1 {
		t.Fatalf("%d keys stored, want 1", len(mem.m))
	}
	var stored []byte
	for k, e := range mem.m {
		h := e.fields[headerField]
		stored = append([]byte(nil), h[:len(h)-1]...) // one byte short: it cannot decode
		e.fields[headerField] = stored
		mem.m[k] = e
	}
	_, err := askFW(1000)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ask on a header that does not decode: %v, want ErrUnavailable", err)
	}
	for _, e := range mem.m {
		if string(e.fields[headerField]) != string(stored) {
			t.Fatal("the undecodable header was overwritten")
		}
	}
	if n := testutil.ToFloat64(s.m.corrupt); n != 1 {
		t.Fatalf("sluice_controlplane_quota_corrupt_headers_total = %v, want 1", n)
	}
}

// TestRoomForAnIdentityIsMadeFromItsOwnEntries: a newcomer of an identity at its
// bound of entries makes the next sweep forget that identity's idle entries, and
// only those: another identity's idle entries stay (a sweep under pressure is for
// the asker that needs room, not for every entry of the key).
func TestRoomForAnIdentityIsMadeFromItsOwnEntries(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	mem := NewMemory()
	p := newPolicies(t)
	s := New(Options{Backend: mem, Policies: p, Open: true, Now: clk.Now, MaxEntriesPerIdentity: 2})
	a, b := Owner("spiffe://t/a"), Owner("spiffe://t/b")
	askAs := func(owner, envoy string, want, ret uint64) quota.KeyResult {
		t.Helper()
		resp, err := s.HandleFor(context.Background(), owner, &quota.Request{Envoy: envoy, Policy: "p", Version: 1, Env: testEnv,
			Interval: time.Second, Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: want, Return: ret}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Keys[0]
	}
	entriesOf := func(owner string) int {
		_, _ = keyLedger(t, s, mem, p, "fw", globalKey("fw"))
		n := 0
		for _, e := range mem.m {
			for name := range e.fields {
				if strings.HasPrefix(name, entryPrefix+owner) {
					n++
				}
			}
		}
		return n
	}
	// Two idle entries of each identity: granted, then everything returned.
	for _, o := range []string{a, b} {
		for _, e := range []string{"e1", "e2"} {
			r := askAs(o, e, 1, 0)
			askAs(o, e, 0, r.Held)
		}
	}
	if entriesOf(a) != 2 || entriesOf(b) != 2 {
		t.Fatalf("entries: a %d, b %d; want 2 and 2", entriesOf(a), entriesOf(b))
	}
	// A third Envoy of a: answered retry (its identity is full), then let in
	// once a sweep has made room among a's idle entries.
	clk.add(time.Second)
	if r := askAs(a, "e3", 1, 0); r.Status != quota.StatusRetry {
		t.Fatalf("a's third Envoy: %+v, want retry (its identity holds its most entries)", r)
	}
	clk.add(time.Second)
	if r := askAs(a, "e3", 1, 0); r.Status != quota.StatusGranted && r.Status != quota.StatusPartial {
		t.Fatalf("a's third Envoy after the sweep: %+v, want a grant", r)
	}
	if got := entriesOf(b); got != 2 {
		t.Fatalf("b's idle entries after the sweep that made room for a: %d, want 2 (not a's to take)", got)
	}
}

// An entry's one slot for its first grant holds granted for a windowed key and
// unspent for a bucket; each decodes back into the name it was written from.
func TestAnEntryRoundTripsUnderEitherMeaningOfItsFirstSlot(t *testing.T) {
	w := entry{held: 1, exp: 2, tag: 3, last: 4, seq: 5, granted: 6}
	if got, ok := decodeEntry(w.encode(true), true); !ok || got != w {
		t.Errorf("windowed: %+v %v, want %+v", got, ok, w)
	}
	b := entry{held: 1, exp: 2, tag: 3, last: 4, seq: 5, unspent: 7}
	if got, ok := decodeEntry(b.encode(false), false); !ok || got != b {
		t.Errorf("bucket: %+v %v, want %+v", got, ok, b)
	}
	if len(w.encode(true)) != entrySize {
		t.Errorf("an entry is %d bytes, want %d", len(w.encode(true)), entrySize)
	}
}

// heldSum follows one rule: it never wraps below zero.
func TestHeldSumNeverWrapsBelowZero(t *testing.T) {
	h := header{heldSum: 5}
	h.moveHeld(8, 2)
	if h.heldSum != 2 {
		t.Errorf("heldSum %d after taking 8 of 5 and adding 2, want 2", h.heldSum)
	}
}
