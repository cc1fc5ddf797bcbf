package quota

import (
	"context"
	"testing"
	"time"
)

// TestAnAskShortOfUnitsLearnsWhatTheOtherLeasesHold: a fixed window of 1,000
// half leased to one entry (its first ask, alone on the key) leaves a second
// entry's ask for 600 units granted the 500 left and told that 500 are held
// elsewhere; once the first reports them used, the second is told that
// nothing is held elsewhere.
func TestAnAskShortOfUnitsLearnsWhatTheOtherLeasesHold(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	s := newService(t, NewMemory(), newPolicies(t), clk)
	fr, reason := s.Resolve("p", testEnv, "fw")
	if fr == nil {
		t.Fatal(reason)
	}
	assign := func(entry string, used, want, need uint64) AssignResult {
		t.Helper()
		res, err := s.Assign(context.Background(), []Assignment{{Rule: fr, Key: "*", Entry: entry,
			Used: used, Want: want, Need: need, Interval: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := assign("a", 0, 1000, 0); r.Granted != 500 || r.HeldElsewhere != 0 {
		t.Fatalf("a: granted %d, held elsewhere %d; want 500 and 0", r.Granted, r.HeldElsewhere)
	}
	if r := assign("b", 0, 600, 600); r.Granted != 500 || r.HeldElsewhere != 500 {
		t.Fatalf("b: granted %d, held elsewhere %d; want 500 and 500", r.Granted, r.HeldElsewhere)
	}
	assign("a", 500, 0, 0)
	if r := assign("b", 1, 1, 1); r.Granted != 0 || r.HeldElsewhere != 0 {
		t.Fatalf("b after a reported: granted %d, held elsewhere %d; want 0 and 0", r.Granted, r.HeldElsewhere)
	}
}
