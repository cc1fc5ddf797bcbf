package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the RLQS service's Prometheus metrics:
//
//	sluice_controlplane_rlqs_streams                   streams open now
//	sluice_controlplane_rlqs_buckets                   buckets tracked now, all streams together
//	sluice_controlplane_rlqs_streams_refused_total     streams refused (authentication, MaxStreams)
//	sluice_controlplane_rlqs_reports_total             usage reports received
//	sluice_controlplane_rlqs_invalid_reports_total     reports without a domain (the stream is ended) and
//	                                                   usages without a bucket id (skipped)
//	sluice_controlplane_rlqs_actions_total{action}     bucket actions: token_bucket, deny_all, allow_all,
//	                                                   abandon, none (the Envoy keeps what it has)
//	sluice_controlplane_rlqs_abandoned_total{reason}   buckets abandoned, by reason
//	sluice_controlplane_rlqs_units_charged_total       units reported allowed beyond every grant
//	                                                   (fail-open admissions), taken from the budget
//	sluice_controlplane_rlqs_reports_clamped_total     bucket usages whose allowed count was more than the
//	                                                   bucket could admit, clamped to that (bucket.admittable)
//	sluice_controlplane_rlqs_unavailable_total         reports left unanswered because the quota
//	                                                   store failed
//	sluice_controlplane_rlqs_follow_ups_total          buckets asked for without a report: an assignment
//	                                                   pushed before the last one dies (stream.followUps)
//	sluice_controlplane_rlqs_report_duration_seconds   report received → response sent (histogram)
type metrics struct {
	streams, buckets                       prometheus.Gauge
	refused, reports, invalid, unavailable prometheus.Counter
	charged, clamped, followUps            prometheus.Counter
	actions, abandoned                     *prometheus.CounterVec
	duration                               prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controlplane_rlqs_streams",
			Help: "RLQS streams open now (one per Envoy and filter configuration)."}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controlplane_rlqs_buckets",
			Help: "RLQS buckets tracked now, all streams together (bounded by --rlqs-max-buckets)."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_streams_refused_total",
			Help: "RLQS streams refused: no or wrong credentials, or the stream limit reached."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_reports_total",
			Help: "RLQS usage reports received."}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_invalid_reports_total",
			Help: "RLQS usage reports without a domain (the stream was ended with INVALID_ARGUMENT) and bucket usages without a bucket id (skipped)."}),
		unavailable: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_unavailable_total",
			Help: "RLQS reports left without new assignments because the quota store failed; Envoys keep their assignments until they expire."}),
		charged: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_units_charged_total",
			Help: "Units Envoys reported allowed beyond every assignment (admitted by a fail-open behaviour), taken from the budget."}),
		clamped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_reports_clamped_total",
			Help: "RLQS bucket usages reporting more requests allowed than the bucket's assignment (or one window of a fail-open rule) could admit, clamped to that."}),
		followUps: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_follow_ups_total",
			Help: "RLQS buckets asked for without a report: the next assignment pushed before the last one dies, while the bucket has requests."}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_actions_total",
			Help: "Bucket actions decided: token_bucket, deny_all, allow_all (exempt), abandon, none (the Envoy keeps its assignment)."}, []string{"action"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rlqs_abandoned_total",
			Help: "Buckets abandoned, by reason (unknown_policy, unknown_rule, not_fleet, missing_key_part, unknown_entry, idle, ...)."}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_controlplane_rlqs_report_duration_seconds",
			Help:    "Time from receiving an RLQS usage report to sending its response, in seconds.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, 1}}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.buckets, m.refused, m.reports, m.invalid, m.unavailable, m.charged, m.clamped, m.followUps, m.actions, m.abandoned, m.duration)
	}
	return m
}
