package quota

import (
	"testing"
	"time"
)

// TestGrantSizing follows the sizing rule of the README: with no history an Envoy
// gets what it wants, capped at half of what is left when alone; with history, its
// recent rate for 5/4 of its report interval, minus what it holds unspent (units
// it reports used are no longer held); with others
// active, a fixed window's fair share ⌈L/n⌉ less what it was granted in the window,
// or a share of what the others' unclaimed shares leave; near the limit, single
// units.
func TestGrantSizing(t *testing.T) {
	clk := &clock{}
	start := base() + int64(time.Second)
	clk.set(start)
	s := newService(t, NewMemory(), newPolicies(t), clk)
	key := globalKey("fw")
	es := newEnvoys(3)
	a, b, c := es[0], es[1], es[2]
	if r := ask(t, s, a, "fw", key, 0, 0, 1000); r.Granted != 500 || r.Status != "partial" {
		t.Fatalf("lone Envoy, no history: %+v, want 500 (half of 1000)", r)
	}
	clk.add(time.Second)
	// 100 used in the last second: demand ⌊100·5/4⌋+1 = 126, it holds 400 unspent:
	// one unit.
	if r := ask(t, s, a, "fw", key, 100, 0, 1000); r.Granted != 1 || r.Held != 401 {
		t.Fatalf("Envoy holding more than its demand: %+v, want 1 granted, 401 held", r)
	}
	clk.add(time.Second)
	// It used 100 more and gives back 250 of its 301 unspent: demand 126 - 51 held = 75.
	if r := ask(t, s, a, "fw", key, 100, 250, 1000); r.Returned != 250 || r.Granted != 75 || r.Held != 126 {
		t.Fatalf("after a return: %+v, want 250 returned, 75 granted, 126 held", r)
	}
	// A second Envoy while the first is active: its fair share of the window, half
	// of 1000 (the first was granted more than its half already). 200 units were
	// spent, 126 are held.
	const spent = 200
	if r := ask(t, s, b, "fw", key, 0, 0, 1000); r.Granted != 500 {
		t.Fatalf("second Envoy: %+v, want its fair share of the window, 500", r)
	}
	// Fill up to a few units left; then grants are single units.
	for i := 0; i < 100; i++ {
		ask(t, s, c, "fw", key, 0, 0, 1000)
	}
	var total uint64
	for _, e := range es {
		total += e.held
	}
	if total+spent != 1000 {
		t.Fatalf("held %d in total and %d spent, want 1000", total, spent)
	}
	// Near the limit: C returns 3 units. A, granted 326 in the window net of its
	// return (under its share of ⌈1000/3⌉), takes them; B, over its share, would
	// have got single units.
	ask(t, s, c, "fw", key, 0, 3, 0)
	if r := ask(t, s, a, "fw", key, 0, 0, 10); r.Granted != 3 {
		t.Fatalf("near the limit, an Envoy under its share: %+v, want the 3 left", r)
	}
	if r := ask(t, s, a, "fw", key, 0, 0, 10); r.Granted != 0 || r.Status != "refused" || r.RetryAfter != time.Duration(start/int64(time.Minute)*int64(time.Minute)+int64(time.Minute)-clk.Now()) {
		t.Fatalf("at the limit: %+v, want refused until the window ends", r)
	}
}
