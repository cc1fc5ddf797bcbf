package rls

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the rate limit service's Prometheus metrics:
//
//	sluice_controlplane_rls_requests_total{code}          ShouldRateLimit calls answered, by overall code
//	                                                      (ok, over_limit) or gRPC error (invalid, refused)
//	sluice_controlplane_rls_descriptors_total{result,domain,rule}
//	                                                      descriptors decided: ok, over_limit, shadow (over
//	                                                      the limit, answered OK), unlimited, no_limit,
//	                                                      quota_mode, replaced, no_rule; by the rule's domain
//	                                                      and policy/id ("" for no_rule, "(override)" for a
//	                                                      limit override), at most maxRuleSeries rules
//	                                                      labelled, the rest "(other)"
//	sluice_controlplane_rls_asks_total                    asks for units to the quota service
//	sluice_controlplane_rls_ask_failures_total            asks the quota service could not decide
//	sluice_controlplane_rls_failure_decisions_total{on_quota_failure,code}
//	                                                      descriptors decided by on_quota_failure
//	sluice_controlplane_rls_held_waits_total{code}        descriptors that waited for units other holders'
//	                                                      leases held, by how they were answered
//	sluice_controlplane_rls_recalls_total{event}          recalls published, failed to publish, and
//	                                                      answered by returning a lease's units
//	sluice_controlplane_rls_leases                        fleet keys the replica holds a lease on now
//	sluice_controlplane_rls_leases_full_total             decisions on a key beyond the lease bound
//	                                                      (asked for one by one)
//	sluice_controlplane_rls_limit_overrides_total         descriptors carrying a limit override (decided by it)
//	sluice_controlplane_rls_request_duration_seconds      call received → answered (histogram)
type metrics struct {
	requests, descriptors, failureDecisions  *prometheus.CounterVec
	heldWaits, recalls                       *prometheus.CounterVec
	asks, askFailures, leasesFull, overrides prometheus.Counter
	duration                                 prometheus.Histogram
	// The children counted per call.
	ok, overLimit, globalShadow, noRule prometheus.Counter

	rulesMu sync.Mutex
	rules   map[[2]string]*resultCounters // by domain and policy/id
}

// maxRuleSeries bounds the rules whose descriptors are counted under their own
// domain and rule labels (7 series each); the others share "(other)".
const maxRuleSeries = 1000

// resultCounters are one rule's descriptors_total children, by result.
type resultCounters struct {
	ok, over, shadow, quotaMode, unlimited, noLimit, replaced prometheus.Counter
}

// forRule returns the counters of rule (policy/id) of domain, made once.
func (m *metrics) forRule(domain, rule string) *resultCounters {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	k := [2]string{domain, rule}
	if c := m.rules[k]; c != nil {
		return c
	}
	if len(m.rules) >= maxRuleSeries {
		k = [2]string{"(other)", "(other)"}
		if c := m.rules[k]; c != nil {
			return c
		}
	}
	l := func(result string) prometheus.Counter { return m.descriptors.WithLabelValues(result, k[0], k[1]) }
	c := &resultCounters{ok: l("ok"), over: l("over_limit"), shadow: l("shadow"), quotaMode: l("quota_mode"),
		unlimited: l("unlimited"), noLimit: l("no_limit"), replaced: l("replaced")}
	m.rules[k] = c
	return c
}

func newMetrics(reg *prometheus.Registry, leases func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_requests_total",
			Help: "RateLimitService ShouldRateLimit calls, by overall code (ok, over_limit; shadow: over_limit answered OK by the global shadow mode) or error (invalid, refused)."}, []string{"code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_descriptors_total",
			Help: "Rate limit descriptors decided: ok, over_limit, shadow (over the limit of a shadow rule, answered OK), unlimited, no_limit (a no_limit rule's, answered OK without a limit), quota_mode (over the limit of a quota-mode rule, answered OK with the limit), replaced (by another descriptor's rule in the call), no_rule; by the rule's domain and policy/id (empty for no_rule, (override) for a limit override; past 1000 rules, (other))."}, []string{"result", "domain", "rule"}),
		failureDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_failure_decisions_total",
			Help: "Descriptors decided by the rule's on_quota_failure because the quota service could not decide, by that policy and code."}, []string{"on_quota_failure", "code"}),
		heldWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_held_waits_total",
			Help: "Descriptors that lacked units other holders' leases held and waited for them, by the code they were answered."}, []string{"code"}),
		recalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_recalls_total",
			Help: "Recalls of other replicas' units of a key: published, failed (not published), returned (this replica gave a lease's units back)."}, []string{"event"}),
		asks: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rls_asks_total",
			Help: "Asks of the rate limit service for units of a fleet key (each one quota service round for its key)."}),
		askFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rls_ask_failures_total",
			Help: "Asks of the rate limit service the quota service could not decide (store unavailable or too slow)."}),
		overrides: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rls_limit_overrides_total",
			Help: "Rate limit descriptors carrying a limit override (from Envoy's route configuration), decided by that limit."}),
		leasesFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rls_leases_full_total",
			Help: "Descriptors on a fleet key beyond the replica's lease bound, decided by an ask of their own."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_controlplane_rls_request_duration_seconds",
			Help:    "Time from receiving a ShouldRateLimit call to answering it, in seconds.",
			Buckets: []float64{.00005, .0001, .0002, .0005, .001, .002, .005, .01, .025, .1, .25, 1}}),
	}
	m.ok, m.overLimit, m.globalShadow = m.requests.WithLabelValues("ok"), m.requests.WithLabelValues("over_limit"), m.requests.WithLabelValues("shadow")
	m.noRule = m.descriptors.WithLabelValues("no_rule", "", "")
	m.rules = map[[2]string]*resultCounters{}
	if reg != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_controlplane_rls_leases",
			Help: "Fleet keys the rate limit service holds a lease on now."}, leases)
		reg.MustRegister(m.requests, m.descriptors, m.failureDecisions, m.heldWaits, m.recalls, m.asks, m.askFailures, m.leasesFull, m.overrides, m.duration, g)
	}
	return m
}
