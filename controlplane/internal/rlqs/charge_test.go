package rlqs

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// downable is a quota backend that can be made to fail, as a Redis that stalls.
type downable struct {
	quota.Backend
	down atomic.Bool
}

var errStoreDown = errors.New("store down")

func (d *downable) Load(ctx context.Context, keys []quota.Read) ([]quota.Snapshot, error) {
	if d.down.Load() {
		return nil, errStoreDown
	}
	return d.Backend.Load(ctx, keys)
}

func (d *downable) Swap(ctx context.Context, ops []quota.Op) ([]bool, error) {
	if d.down.Load() {
		return nil, errStoreDown
	}
	return d.Backend.Swap(ctx, ops)
}

// chargeFixture is a server on simPolicy whose quota service keeps its state in
// backend, at the virtual time now (f.now moves it).
type chargeFixture struct {
	*fixture
	t *testing.T
}

func newChargeFixture(t *testing.T, backend quota.Backend, now int64) chargeFixture {
	f := &fixture{pol: &policies{}, reg: prometheus.NewRegistry(), now: now}
	f.pol.set(t, simPolicy)
	clock := func() int64 { return f.now }
	f.q = quota.New(quota.Options{Backend: backend, Policies: f.pol, Open: true, Now: clock, Timeout: time.Minute, Registry: f.reg})
	f.srv = New(Options{Quota: f.q, Now: clock, Registry: f.reg})
	return chargeFixture{f, t}
}

// charged is the units charged so far (sluice_controlplane_rlqs_units_charged_total).
func (f chargeFixture) charged() float64 {
	return counterWith(f.t, f.reg, "sluice_controlplane_rlqs_units_charged_total", "", "")
}

// TestFailOpenUsageWhileTheStoreIsDownIsChargedWhenItIsBack: an Envoy whose
// assignment ran out while the store was down admits with ALLOW_ALL (on_quota_failure
// "pass"); those requests are covered by no live assignment, whatever was granted,
// returned or forfeited before, so all of them are charged once the store answers.
func TestFailOpenUsageWhileTheStoreIsDownIsChargedWhenItIsBack(t *testing.T) {
	m := int64(time.Minute)
	store := &downable{Backend: quota.NewMemory()}
	f := newChargeFixture(t, store, time.Now().UnixNano()/m*m+m)
	ss := f.srv.newStream("")
	id := map[string]string{"policy": "p", "rule": "pass", "user": "u"}
	charged := f.charged

	f.send(ss, report(simEnv, 1, 100, id)) // the first request, before any assignment: charged
	base := charged()
	f.now += int64(time.Second)
	f.send(ss, report(simEnv, 20, 0, id)) // spent from the token bucket granted
	if got := charged(); got != base {
		t.Fatalf("usage covered by the assignment was charged: %v → %v", base, got)
	}
	// The store stalls for longer than the assignment lives: the Envoy falls back to
	// ALLOW_ALL and admits 100, reported while the store is still down.
	store.down.Store(true)
	for i := 0; i < 6; i++ {
		f.now += int64(time.Second)
		allowed := uint64(0)
		if i >= 3 {
			allowed = 100 / 3
		}
		f.send(ss, report(simEnv, allowed, 0, id))
	}
	store.down.Store(false)
	f.now += int64(time.Second)
	f.send(ss, report(simEnv, 1, 0, id))
	if got := charged() - base; got < 3*(100/3) {
		t.Fatalf("charged %v of the %d requests admitted without a live assignment", got, 3*(100/3))
	}
}

// TestUnitsSpentBeforeAnAssignmentEndedAreNotChargedWhenReportedAfterIt: Envoy
// reports what it admitted since its last report, so a report that arrives after
// an assignment ended still counts the units that assignment admitted while it
// lived (at Envoy's 5 s cadence: granted 5 s into a 10 s window, ended before the
// window did, reported just after). They were granted, and so counted, already:
// charging them again would count them twice and shrink the next window's budget
// by them (a real Envoy offered 5 × L then admitted 50 of 100 in a window).
func TestUnitsSpentBeforeAnAssignmentEndedAreNotChargedWhenReportedAfterIt(t *testing.T) {
	w := int64(10 * time.Second)
	f := newChargeFixture(t, quota.NewMemory(), time.Now().UnixNano()/w*w+w+int64(5050*time.Millisecond))
	ss := f.srv.newStream("")
	id := map[string]string{"policy": "p", "rule": "pass", "user": "u"}
	charged := f.charged

	resp := f.send(ss, report(simEnv, 1, 60, id)) // the first request, before any assignment: charged
	if len(resp.BucketAction) == 0 || resp.BucketAction[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() >= 5*time.Second {
		t.Fatalf("want a token bucket that ends before the next report: %v", resp)
	}
	base := charged()
	f.now += int64(5 * time.Second) // the next report, in the next window
	f.send(ss, report(simEnv, 1, 0, id))
	if got := charged(); got != base {
		t.Fatalf("a unit the assignment admitted while it lived was charged again: %v → %v", base, got)
	}
}

// TestAReportStraddlingAReplacementIsChargedOnce: a report counts what the
// Envoy admitted since its previous one, so when a grant replaced the last one
// between two reports (a slow store round sent it late), that report's units
// were admitted by the old assignment, or by the new, or both. Spending them from
// the new one first would leave the new one short for what it admits next, and
// that would be charged although its grant counted it already. The assignments
// that can no longer cover later reports are spent first, oldest first.
func TestAReportStraddlingAReplacementIsChargedOnce(t *testing.T) {
	const s = int64(time.Second)
	margin := DefaultMargin
	b := &bucket{}
	b.report(1*s, 0, margin)
	b.lastReport = 1 * s
	b.credits = append(b.credits, credit{units: 10, left: 10, held: 10, at: 1 * s, ttl: 6 * s})
	// Replaced at 4 s: the old one admitted 10 before that, reported at 5 s.
	b.credits = append(b.credits, credit{units: 10, left: 10, held: 10, at: 4 * s, ttl: 6 * s})
	b.report(5*s, 10, margin)
	b.lastReport = 5 * s
	// The new one admits its 10 by 9.5 s, reported then.
	b.report(9*s+s/2, 10, margin)
	if b.toCharge() != 0 {
		t.Fatalf("%d units charged: every unit reported was granted, and counted, once", b.toCharge())
	}
}

// TestAGrantIsNotWithheldForUnitsAReportSpent: what a live token bucket still
// holds (keep, which withholds a grant no larger) is never more than its units
// less everything reported since it was sent, whichever assignment admitted
// them: a grant withheld for units the Envoy no longer holds leaves it denied.
func TestAGrantIsNotWithheldForUnitsAReportSpent(t *testing.T) {
	const s = int64(time.Second)
	margin := DefaultMargin
	b := &bucket{}
	b.lastReport = 1 * s
	b.credits = append(b.credits, credit{units: 10, left: 10, held: 10, at: 1 * s, ttl: 6 * s})
	b.credits = append(b.credits, credit{units: 10, left: 10, held: 10, at: 4 * s, ttl: 6 * s})
	b.tbUntil = 10 * s
	b.report(5*s, 10, margin)
	if got := b.keep(5 * s); got != 0 {
		t.Fatalf("keep = %d after a report of 10 since the live assignment of 10 was sent: want 0", got)
	}
}
