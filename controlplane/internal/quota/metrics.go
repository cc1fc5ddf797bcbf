package quota

import (
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// metrics are the quota service's Prometheus metrics:
//
//	sluice_controlplane_quota_units_asked_total       units asked (sum of want)
//	sluice_controlplane_quota_units_granted_total     units granted
//	sluice_controlplane_quota_units_returned_total    units returned and credited back
//	sluice_controlplane_quota_units_charged_total     units Envoys admitted without a lease (cut off from
//	                                                  the service), booked against their keys' budgets
//	sluice_controlplane_quota_keys_total{status}      keys answered, by status (granted, partial, refused, stale_policy, ...)
//	sluice_controlplane_quota_cas_retries_total       compare-and-swap conflicts retried (per key)
//	sluice_controlplane_quota_rounds_total            read–decide–write rounds run (per key and attempt)
//	sluice_controlplane_quota_reads_skipped_total     rounds decided from what this service last wrote
//	                                                  (readCache: no one else wrote the key since)
//	sluice_controlplane_quota_contended_total{stage}  keys answered retry because of contention:
//	                                                  stage "queued" (still queued at the request's deadline)
//	                                                  or "round" (conflicts with other replicas past the timeout)
//	sluice_controlplane_quota_ledger_evictions_total   entries the sweep forgot: Envoys silent for 2 min, or,
//	                                                  while a newcomer finds a key or identity full, any
//	                                                  entry that can give way (ledger.sweep)
//	sluice_controlplane_quota_ledger_full_total{scope}  newcomers answered retry because their identity
//	                                                  (scope "identity") or the key (scope "key") holds
//	                                                  its most entries
//	sluice_controlplane_quota_corrupt_headers_total    rounds of a key whose stored header did not decode
//	                                                  (answered 503, nothing granted or written)
//	sluice_controlplane_quota_request_duration_seconds{code}  request latency (histogram)
//	sluice_controlplane_quota_keys_active{policy,rule}         keys asked for in the last minute, per rule
//
// keys_active has at most maxRuleSeries label pairs (further rules are counted
// under rule "_other") and counts at most maxKeysPerRule keys per rule.
type metrics struct {
	asked, granted, returned, charged    prometheus.Counter
	casRetries, readsSkipped             prometheus.Counter
	rounds, queueTimeouts, roundTimeouts prometheus.Counter
	evictions, identityFull, keyFull     prometheus.Counter
	corrupt                              prometheus.Counter
	keys                                 *prometheus.CounterVec
	duration                             *prometheus.HistogramVec
	active                               *activeKeys
}

const (
	maxRuleSeries  = 1000
	maxKeysPerRule = 100000
	activeWindow   = time.Minute
)

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		asked: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_units_asked_total",
			Help: "Quota units asked for by Envoys (sum of want)."}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_units_granted_total",
			Help: "Quota units granted."}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_units_returned_total",
			Help: "Unused quota units returned by Envoys and credited back."}),
		charged: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_units_charged_total",
			Help: "Quota units Envoys admitted without a lease (on_quota_failure local or pass, while they could not reach the service), booked against their keys' budgets."}),
		casRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_cas_retries_total",
			Help: "Keys decided again after a compare-and-swap conflict."}),
		readsSkipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_reads_skipped_total",
			Help: "Rounds decided from what this service last wrote to or read of the key (no one else wrote it since), without reading it."}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_rounds_total",
			Help: "Read-decide-write rounds run on the backend, per key and attempt; asks per round shows how much contention was combined."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_ledger_evictions_total",
			Help: "Ledger entries forgotten by the sweep: Envoys that stopped reporting (2 min), or, while a newcomer finds a key or its identity full, entries without a live lease or whose Envoy stopped reporting."}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controlplane_quota_corrupt_headers_total",
			Help: "Rounds of a counter key whose stored header did not decode: nothing was granted (the asks were answered 503) and nothing written."}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_quota_keys_total",
			Help: "Keys answered, by status."}, []string{"status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_controlplane_quota_request_duration_seconds",
			Help:    "Quota request latency in seconds, by HTTP status code.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, 1}}, []string{"code"}),
		active: newActiveKeys(),
	}
	contended := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_quota_contended_total",
		Help: "Keys answered retry because other asks held the key past the deadline (stage queued) or other replicas kept winning its compare-and-swap (stage round). Contention, not a backend outage."},
		[]string{"stage"})
	m.queueTimeouts, m.roundTimeouts = contended.WithLabelValues("queued"), contended.WithLabelValues("round")
	full := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_quota_ledger_full_total",
		Help: "Envoys new to a key answered retry because their identity (scope identity) or the key (scope key) holds its most ledger entries; a sweep then forgets those that can give way."},
		[]string{"scope"})
	m.identityFull, m.keyFull = full.WithLabelValues("identity"), full.WithLabelValues("key")
	if reg != nil {
		reg.MustRegister(m.asked, m.granted, m.returned, m.charged, m.casRetries, m.readsSkipped, m.rounds, m.evictions, m.corrupt, contended, full, m.keys, m.duration, m.active)
	}
	return m
}

func (m *metrics) observe(code int, d time.Duration) {
	m.duration.WithLabelValues(strconv.Itoa(code)).Observe(d.Seconds())
}

func (m *metrics) count(req *quota.Request, resp *quota.Response) {
	for i := range req.Keys {
		m.asked.Add(float64(req.Keys[i].Want))
		r := &resp.Keys[i]
		m.granted.Add(float64(r.Granted))
		m.returned.Add(float64(r.Returned))
		if quota.Recorded(r.Status) {
			m.charged.Add(float64(req.Keys[i].Charge))
		}
		m.keys.WithLabelValues(r.Status).Inc()
	}
}

func (m *metrics) touch(policy, rule, key string) { m.active.touch(policy, rule, key, time.Now()) }

// activeKeys tracks, per rule, the keys asked for recently. Every key ask touches
// it, so it takes no lock shared by all asks: rules are found in a sync.Map, and each
// rule's keys are spread over activeShards maps with a lock each.
type activeKeys struct {
	seed  maphash.Seed
	rules sync.Map   // [2]string{policy, rule} → *ruleKeys
	mu    sync.Mutex // serialises adding and removing rules
	nrule int        // rules in the map, under mu
}

const activeShards = 16

// ruleKeys is one rule's recently asked keys.
type ruleKeys struct {
	n      atomic.Int64 // keys held, across shards
	shards [activeShards]struct {
		mu   sync.Mutex
		last map[string]int64 // key → last ask, Unix ns
	}
}

var activeDesc = prometheus.NewDesc("sluice_controlplane_quota_keys_active",
	"Counter keys of each fleet rule asked for in the last minute (at most 100000 per rule).", []string{"policy", "rule"}, nil)

func newActiveKeys() *activeKeys { return &activeKeys{seed: maphash.MakeSeed()} }

func (a *activeKeys) touch(policy, rule, key string, now time.Time) {
	id := [2]string{policy, rule}
	v, ok := a.rules.Load(id)
	if !ok {
		v = a.add(id)
	}
	rk := v.(*ruleKeys)
	sh := &rk.shards[maphash.String(a.seed, key)%activeShards]
	sh.mu.Lock()
	if _, seen := sh.last[key]; seen {
		sh.last[key] = now.UnixNano()
	} else if rk.n.Load() < maxKeysPerRule {
		sh.last[key] = now.UnixNano()
		rk.n.Add(1)
	}
	sh.mu.Unlock()
}

// add returns the keys of rule id, adding them (or, past maxRuleSeries rules, the
// "_other" series).
func (a *activeKeys) add(id [2]string) any {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.rules.Load(id); ok {
		return v
	}
	if a.nrule >= maxRuleSeries {
		id = [2]string{"_other", "_other"}
		if v, ok := a.rules.Load(id); ok {
			return v
		}
	}
	rk := &ruleKeys{}
	for i := range rk.shards {
		rk.shards[i].last = make(map[string]int64)
	}
	a.rules.Store(id, rk)
	a.nrule++
	return rk
}

// Describe implements prometheus.Collector.
func (a *activeKeys) Describe(ch chan<- *prometheus.Desc) { ch <- activeDesc }

// Collect implements prometheus.Collector; it forgets keys idle for a minute, and
// rules with no key left (an ask racing with that removal may go uncounted for up to
// a minute).
func (a *activeKeys) Collect(ch chan<- prometheus.Metric) {
	cut := time.Now().Add(-activeWindow).UnixNano()
	a.rules.Range(func(k, v any) bool {
		id, rk := k.([2]string), v.(*ruleKeys)
		for i := range rk.shards {
			sh := &rk.shards[i]
			sh.mu.Lock()
			for key, t := range sh.last {
				if t < cut {
					delete(sh.last, key)
					rk.n.Add(-1)
				}
			}
			sh.mu.Unlock()
		}
		n := rk.n.Load()
		if n == 0 {
			a.mu.Lock()
			if cur, ok := a.rules.Load(id); ok && cur == rk {
				a.rules.Delete(id)
				a.nrule--
			}
			a.mu.Unlock()
			return true
		}
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(n), id[0], id[1])
		return true
	})
}
