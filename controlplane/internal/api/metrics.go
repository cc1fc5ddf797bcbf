package api

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
)

// metrics are the server's Prometheus metrics, on its own registry:
//
//	sluice_controlplane_http_requests_total{route,method,code}
//	sluice_controlplane_http_request_duration_seconds{route,method,code}  (histogram, seconds)
//	sluice_controlplane_watchers                   open long polls
//	sluice_controlplane_store_errors_total         failed store operations
//	sluice_controlplane_store_up                   1 if the store answered the last resync
//	sluice_controlplane_store_regressions_total    times the store was found to have lost acknowledged writes
//	sluice_controlplane_store_restores_total       lost policies this replica wrote back (--restore-lost-policies)
//	sluice_controlplane_policies                   live policies in this replica's snapshot
//	sluice_controlplane_policy_version{policy}     current version of a live policy, for the
//	                                               first MaxPolicyMetrics policies by name only
//
// The endpoint is public, so its size must not grow with the number of
// policies: every label set above is bounded (route patterns, methods,
// status codes, at most MaxPolicyMetrics policy names).
type metrics struct {
	handler  http.Handler
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	watchers atomic.Int64
}

func newMetrics(reg *prometheus.Registry, snap *snapshot.Snapshot) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controlplane_http_requests_total",
			Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_controlplane_http_request_duration_seconds",
			Help:    "HTTP request latency in seconds by route pattern, method and status code (long polls include their wait).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 60},
		}, []string{"route", "method", "code"}),
	}
	reg.MustRegister(m.requests, m.duration,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_controlplane_watchers",
			Help: "Long polls currently open.",
		}, func() float64 { return float64(m.watchers.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_controlplane_store_errors_total",
			Help: "Store operations that failed (unreachable or erroring store).",
		}, func() float64 { return float64(snap.StoreErrors()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_controlplane_store_regressions_total",
			Help: "Times this replica found that the store had lost acknowledged writes of a policy (its version went back or its epoch changed); each is also logged at error level.",
		}, func() float64 { return float64(snap.Regressions()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_controlplane_store_restores_total",
			Help: "Policies the store had lost that this replica wrote back as a new version (--restore-lost-policies); each is also logged at error level.",
		}, func() float64 { return float64(snap.Restores()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_controlplane_store_up",
			Help: "1 if the store answered the last resync, else 0.",
		}, func() float64 {
			if snap.Healthy() {
				return 1
			}
			return 0
		}),
		versionCollector{snap},
	)
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// MaxPolicyMetrics is how many policies (the first by name) get a
// sluice_controlplane_policy_version series; the others are counted in
// sluice_controlplane_policies only. GET /v1/policies lists them all.
const MaxPolicyMetrics = 100

var (
	versionDesc = prometheus.NewDesc("sluice_controlplane_policy_version",
		"Current version of a live policy in this replica's snapshot, for the first "+strconv.Itoa(MaxPolicyMetrics)+" policies by name only.", []string{"policy"}, nil)
	policiesDesc = prometheus.NewDesc("sluice_controlplane_policies",
		"Live policies in this replica's snapshot.", nil, nil)
)

// versionCollector reports the snapshot's versions at scrape time.
type versionCollector struct{ snap *snapshot.Snapshot }

// Describe implements prometheus.Collector.
func (c versionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- versionDesc; ch <- policiesDesc }

// Collect implements prometheus.Collector.
func (c versionCollector) Collect(ch chan<- prometheus.Metric) {
	list := c.snap.List()
	ch <- prometheus.MustNewConstMetric(policiesDesc, prometheus.GaugeValue, float64(len(list)))
	for i, r := range list {
		if i == MaxPolicyMetrics {
			break
		}
		ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(r.Version), r.Name)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the first status code.
func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200.
func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// instrument counts and times requests under route (the pattern, so the
// label set stays bounded).
func (s *Server) instrument(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("api: handler panic", "route", route, "method", r.Method, "panic", v)
				if rec.status == 0 {
					writeError(rec, http.StatusInternalServerError, "internal", "internal error", nil)
				}
			}
			method := r.Method
			switch method {
			case http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodHead:
			default:
				method = "other"
			}
			code := strconv.Itoa(rec.status)
			s.metrics.requests.WithLabelValues(route, method, code).Inc()
			s.metrics.duration.WithLabelValues(route, method, code).Observe(time.Since(start).Seconds())
		}()
		h.ServeHTTP(rec, r)
	})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, _ role) {
	s.metrics.handler.ServeHTTP(w, r)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request, _ role) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request, _ role) {
	if !s.o.Snapshot.Healthy() {
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable; reads are served from the last snapshot, writes fail", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
