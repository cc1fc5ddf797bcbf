package quota

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestActiveKeysCountsEachRulesRecentKeys: keys asked for concurrently are counted
// once per rule; keys idle for a minute are forgotten, and so is a rule left with
// none.
func TestActiveKeysCountsEachRulesRecentKeys(t *testing.T) {
	a := newActiveKeys()
	now := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				a.touch("p", "r1", "k"+strconv.Itoa(i), now)
				a.touch("p", "r2", "k"+strconv.Itoa(i%10), now)
			}
		}()
	}
	wg.Wait()
	a.touch("p", "old", "k", now.Add(-2*activeWindow))
	reg := prometheus.NewRegistry()
	reg.MustRegister(a)
	want := `
# HELP sluice_controlplane_quota_keys_active Counter keys of each fleet rule asked for in the last minute (at most 100000 per rule).
# TYPE sluice_controlplane_quota_keys_active gauge
sluice_controlplane_quota_keys_active{policy="p",rule="r1"} 500
sluice_controlplane_quota_keys_active{policy="p",rule="r2"} 10
`
	for range 2 { // the second scrape finds the idle rule gone
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_controlplane_quota_keys_active"); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	n := a.nrule
	a.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d rules tracked after the idle one was forgotten, want 2", n)
	}
}
