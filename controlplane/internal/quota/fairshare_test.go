package quota

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// TestATopUpNeverTakesAnotherEnvoysUnclaimedShare replays three Envoys
// spending a fixed window of 300 with a demand of 100 each: their first asks
// of 16 units (MinWant), then sized asks, one Envoy's periodic report (its
// lease runs low: 54 of its units unspent, 30 used since) before the last
// Envoy's sized ask. The Envoy that already holds its fair share (100) with
// units unspent is granted nothing of the 84 the last one has not claimed yet,
// and its answer is a grant of 0 (never refused or partial, which would make
// its filter deny once the lease runs dry); the last Envoy then finds its whole
// share, and every Envoy is granted exactly its 100.
func TestATopUpNeverTakesAnotherEnvoysUnclaimedShare(t *testing.T) {
	for _, bk := range singleBackends {
		t.Run(bk.name, func(t *testing.T) {
			b, _, _, _ := bk.open(t)
			s, clk := newService300(t, b)
			key := globalKey("fw")
			es := newEnvoys(3)
			a, bb, c := es[0], es[1], es[2]
			var total [3]uint64
			take := func(e *envoy, used, want uint64) quota.KeyResult {
				t.Helper()
				r := ask(t, s, e, "fw", key, used, 0, want)
				total[e.id] += r.Granted
				return r
			}

			for _, e := range es {
				if r := take(e, 0, 16); r.Granted != 16 {
					t.Fatalf("%s's first ask: %+v, want 16", e.name, r)
				}
			}
			clk.add(100 * time.Millisecond)
			if r := take(a, 16, 1<<20); r.Granted != 84 {
				t.Fatalf("a's sized ask: %+v, want 84 (the rest of its fair share)", r)
			}
			if r := take(c, 16, 1<<20); r.Granted != 84 {
				t.Fatalf("c's sized ask: %+v, want 84 (the rest of its fair share)", r)
			}
			clk.add(200 * time.Millisecond)
			r := take(a, 30, 1<<20)
			if r.Granted != 0 || r.Status != quota.StatusGranted || r.Held != 54 {
				t.Errorf("a's periodic ask, holding its fair share with 54 units unspent: %s %d granted, %d held; want granted 0, 54 held (b has not claimed its share)",
					r.Status, r.Granted, r.Held)
			}
			// b's demand, 16 units in 300 ms, sizes its ask at 67; its next
			// report finds the rest of its share still there.
			if r := take(bb, 16, 1<<20); r.Granted != 67 {
				t.Errorf("b's sized ask: %+v, want 67 (its demand)", r)
			}
			clk.add(700 * time.Millisecond)
			if r := take(bb, 60, 1<<20); r.Granted != 17 {
				t.Errorf("b's periodic ask: %+v, want 17 (the rest of its fair share)", r)
			}
			for i, got := range total {
				if got != 100 {
					t.Errorf("%s was granted %d in the window, want its 100", es[i].name, got)
				}
			}
		})
	}
}

// TestATopUpTakesTheRestOfItsOwnShareAndNoneOfTheOthers: an Envoy one unit
// short of its fair share, with units unspent, is topped up with that unit,
// not with a quarter of what the others have not claimed yet (which left one
// of them a unit short, refused while the other held it).
func TestATopUpTakesTheRestOfItsOwnShareAndNoneOfTheOthers(t *testing.T) {
	s, clk := newService300(t, NewMemory())
	key := globalKey("fw")
	es := newEnvoys(3)
	for _, e := range es {
		ask(t, s, e, "fw", key, 0, 0, 16)
	}
	clk.add(100 * time.Millisecond)
	if r := ask(t, s, es[0], "fw", key, 16, 0, 83); r.Granted != 83 {
		t.Fatalf("a's ask of 83: %+v", r)
	}
	clk.add(100 * time.Millisecond)
	if r := ask(t, s, es[0], "fw", key, 30, 0, 1<<20); r.Granted != 1 || r.Held != 54 {
		t.Errorf("a's top-up, 99 of its 100 granted and 53 unspent: granted %d, held %d; want 1 (the rest of its share), 54", r.Granted, r.Held)
	}
}

// newService300 is a service on b whose rule fw is a fixed window of 300 a
// minute, and its clock, a second into a minute.
func newService300(t *testing.T, b Backend) (*Service, *clock) {
	t.Helper()
	clk := &clock{}
	clk.set(base() + int64(time.Second))
	p := newPolicies(t)
	p.set(t, strings.Replace(testPolicyDoc, `"id":"fw","algorithm":"fixed_window","limit":1000`,
		`"id":"fw","algorithm":"fixed_window","limit":300`, 1))
	return newService(t, b, p, clk), clk
}
