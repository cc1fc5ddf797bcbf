package fleetquota

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
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

// TestACounterLostMidWindowAdmitsAtMostOneMoreLimit: three Envoys share a
// user's key of 60 an hour (on_quota_failure "local") on a control plane whose
// Redis is killed after the window's limit was spent through leases, so the
// Envoys admit their local shares, and then comes back empty, so the service
// counts the window from zero. What the Envoys admitted by themselves in the
// window is spent from the first units granted afterwards: the window admits at
// most 2 L (L through leases before the loss, at most one more L after it,
// local admissions included), not L more on top of them.
func TestACounterLostMidWindowAdmitsAtMostOneMoreLimit(t *testing.T) {
	const limit = 60
	rs := redisproc.Start(t)
	cp := startControlPlane(t, rs.Addr())
	v := cp.put(fixedHour("60", ""))
	var envoys []*envoy
	for i := 0; i < 3; i++ {
		envoys = append(envoys, startEnvoy(t, cp.addr, 1, `,"quota_interval":"200ms","quota_timeout":"300ms"`, v))
	}
	admitted, local, served := 0, 0, 0
	answered := map[int]bool{} // the Envoys an answer of the quota service decided for
	round := func() (denied int) {
		for i, e := range envoys {
			r := e.do(0, "grace")
			degraded := filterstate.Fields(r.FilterState)["quota"] == "degraded"
			if !degraded {
				answered[i] = true
			}
			switch {
			case r.Status != 200:
				denied++
			case degraded:
				admitted++
				local++
			default:
				admitted++
				served++
			}
		}
		return denied
	}
	// The window's limit is spent through leases, and every Envoy hears that
	// three share the key.
	if !proctest.WaitFor(20*time.Second, func() bool { return round() == len(envoys) }) {
		t.Fatal("the Envoys were never denied")
	}
	if served != limit || local != 0 {
		t.Fatalf("before the loss: %d admitted through leases and %d by the Envoys themselves, want %d and 0", served, local, limit)
	}
	rs.Kill()
	// Until the Envoys have spent their local shares (a third each).
	proctest.WaitFor(20*time.Second, func() bool {
		round()
		return local >= limit
	})
	if local == 0 {
		t.Fatal("no Envoy admitted anything by itself while Redis was down")
	}
	rs.Restart()
	// Until every Envoy has been answered by the service again, then as many
	// rounds as it takes to spend a whole fresh limit.
	clear(answered)
	proctest.WaitFor(30*time.Second, func() bool {
		round()
		return len(answered) == len(envoys)
	})
	if len(answered) != len(envoys) {
		t.Fatalf("only Envoys %v were answered by the quota service after Redis came back", answered)
	}
	for i := 0; i < 2*limit; i++ {
		round()
	}
	t.Logf("admitted %d in the window: %d through leases before the loss, %d by the Envoys themselves", admitted, limit, local)
	if admitted > 2*limit {
		t.Errorf("the fleet admitted %d in the window, want at most %d (2 L)", admitted, 2*limit)
	}
}
