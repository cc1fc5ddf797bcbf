package quota

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// TestAChargeTakesAtMostOneWindowOfTheKey: an Envoy cut off from the
// service admits by itself at most the rule's limit in a window (its local
// share of it, and the whole limit before any answer), and a charge it
// reports takes no more: a report of 10^12 units (a filter's bug, or a
// holder of the quota token) leaves every algorithm's key granting again a
// window (and the 10 s of a bucket lease's validity) later. What it takes
// ends with the window: a fixed window's counter ends with it, a bucket's
// debt is clamped at twice its capacity, and it grants again
// once a window has paid the first one off.
func TestAChargeTakesAtMostOneWindowOfTheKey(t *testing.T) {
	for _, rule := range []string{"fw", "tb", "gc", "tw"} {
		t.Run(rule, func(t *testing.T) {
			clk := &clock{}
			clk.set(base())
			s := New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now})
			key := globalKey(rule)
			a, b := &envoy{id: 0, name: "a"}, &envoy{id: 1, name: "b"}
			ask(t, s, a, rule, key, 0, 0, 1)
			resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "a", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
				Keys: []quota.KeyRequest{{Rule: rule, Key: key, Used: 1, Charge: 1e12}}})
			if err != nil || resp.Keys[0].Status == quota.StatusRetry {
				t.Fatalf("the charge: %+v, %v", resp, err)
			}
			// The rules' window is a minute.
			clk.add(time.Minute + 10*time.Second)
			if r := ask(t, s, b, rule, key, 0, 0, 5); r.Granted == 0 {
				t.Errorf("a window after a charge of 10^12, another Envoy is granted nothing: %+v", r)
			}
		})
	}
}
