package fleetquota

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
)

// TestCutOffEnvoysKeepTheFleetNearItsLimit: three Envoys share a user's key of
// 60 an hour (on_quota_failure "local", no local_share). Once each has heard from
// the quota service that three Envoys share the key, cutting every one of them off
// leaves each admitting at most a third of the limit by itself, beyond the units
// it still held: the fleet admits at most 2 L in the window (L through leases, L
// locally), where each falling back to the whole limit would admit up to 4 L.
func TestCutOffEnvoysKeepTheFleetNearItsLimit(t *testing.T) {
	const limit = 60
	cp := startControlPlane(t, "")
	v := cp.put(fixedHour("60", ""))
	var envoys []*envoy
	var proxies []*quotaProxy
	for i := 0; i < 3; i++ {
		qp := newQuotaProxy(t, cp.addr)
		proxies = append(proxies, qp)
		envoys = append(envoys, startEnvoy(t, qp.addr(), 1, `,"quota_interval":"200ms","quota_timeout":"300ms"`, v))
	}
	admitted := 0
	do := func(e *envoy) {
		r := e.do(0, "grace")
		if r.Status == 200 {
			admitted++
		}
	}
	// Everyone joins, then keeps reporting until every Envoy has been answered
	// after the last one joined (so each knows the key is shared by three).
	for _, e := range envoys {
		do(e)
	}
	var after [3]int
	for i, qp := range proxies {
		after[i] = qp.count()
	}
	if !proctest.WaitFor(20*time.Second, func() bool {
		for i, qp := range proxies {
			if qp.count() < after[i]+2 {
				do(envoys[i]) // a use, so the next tick reports the key
				return false
			}
		}
		return true
	}) {
		t.Fatal("the Envoys never reported again")
	}
	before := admitted
	// The control plane is lost to all three.
	for _, qp := range proxies {
		qp.setFault(func(w http.ResponseWriter) bool {
			http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
			return true
		})
	}
	local := make([]int, 3)
	for round := 0; round < 2*limit; round++ {
		for i, e := range envoys {
			r := e.do(0, "grace")
			if r.Status != 200 {
				continue
			}
			admitted++
			if filterstate.Fields(r.FilterState)["quota"] == "degraded" {
				local[i]++
			}
		}
	}
	t.Logf("admitted %d before the outage, %d in all; by each Envoy on its own during it: %v", before, admitted, local)
	for i, n := range local {
		if n > limit/3 {
			t.Errorf("Envoy %d admitted %d by itself, want at most a third of %d", i, n, limit)
		}
	}
	if admitted > 2*limit {
		t.Errorf("the fleet admitted %d in the window, want at most %d", admitted, 2*limit)
	}
}
