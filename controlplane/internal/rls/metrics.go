package rls

import "github.com/prometheus/client_golang/prometheus"

// metrics are the rate limit service's Prometheus metrics:
//
//	sluice_controlplane_rls_requests_total{code}          ShouldRateLimit calls answered, by overall code
//	                                                      (ok, over_limit) or gRPC error (invalid, refused)
//	sluice_controlplane_rls_descriptors_total{result}     descriptors decided: ok, over_limit, shadow (over
//	                                                      the limit, answered OK), unlimited, replaced, no_rule
//	sluice_controlplane_rls_asks_total                    asks for units to the quota service
//	sluice_controlplane_rls_ask_failures_total            asks the quota service could not decide
//	sluice_controlplane_rls_failure_decisions_total{on_quota_failure,code}
//	                                                      descriptors decided by on_quota_failure
//	sluice_controlplane_rls_leases                        fleet keys the replica holds a lease on now
//	sluice_controlplane_rls_leases_full_total             decisions on a key beyond the lease bound
//	                                                      (asked for one by one)
//	sluice_controlplane_rls_limit_overrides_total         descriptors carrying a limit override (decided by it)
//	sluice_controlplane_rls_request_duration_seconds      call received → answered (histogram)
type metrics struct {
	requests, descriptors, failureDecisions  *prometheus.CounterVec
	asks, askFailures, leasesFull, overrides prometheus.Counter
	duration                                 prometheus.Histogram
	// The children counted per call.
	ok, overLimit, dOK, dOver, dShadow, noRule  prometheus.Counter
	dUnlimited, dReplaced, dNoLimit, dQuotaMode prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, leases func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_requests_total",
			Help: "RateLimitService ShouldRateLimit calls, by overall code (ok, over_limit) or error (invalid, refused)."}, []string{"code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_descriptors_total",
			Help: "Rate limit descriptors decided: ok, over_limit, shadow (over the limit of a shadow rule, answered OK), unlimited, no_limit (a no_limit rule's, answered OK without a limit), quota_mode (over the limit of a quota-mode rule, answered OK with the limit), replaced (by another descriptor's rule in the call), no_rule."}, []string{"result"}),
		failureDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_failure_decisions_total",
			Help: "Descriptors decided by the rule's on_quota_failure because the quota service could not decide, by that policy and code."}, []string{"on_quota_failure", "code"}),
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
	m.ok, m.overLimit = m.requests.WithLabelValues("ok"), m.requests.WithLabelValues("over_limit")
	m.dOK, m.dOver = m.descriptors.WithLabelValues("ok"), m.descriptors.WithLabelValues("over_limit")
	m.dShadow, m.noRule = m.descriptors.WithLabelValues("shadow"), m.descriptors.WithLabelValues("no_rule")
	m.dUnlimited, m.dReplaced = m.descriptors.WithLabelValues("unlimited"), m.descriptors.WithLabelValues("replaced")
	m.dNoLimit, m.dQuotaMode = m.descriptors.WithLabelValues("no_limit"), m.descriptors.WithLabelValues("quota_mode")
	if reg != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_controlplane_rls_leases",
			Help: "Fleet keys the rate limit service holds a lease on now."}, leases)
		reg.MustRegister(m.requests, m.descriptors, m.failureDecisions, m.asks, m.askFailures, m.leasesFull, m.overrides, m.duration, g)
	}
	return m
}
