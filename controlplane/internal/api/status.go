package api

import (
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/registry"
	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
)

// The headers by which the filter's long poll identifies its Envoy
// (filter/internal/policysync, poll.go).
const (
	headerNode    = "X-Sluice-Node"
	headerVersion = "X-Sluice-Version"
	headerBuild   = "X-Sluice-Build"
)

// Status values of an Envoy in GET /v1/policies/{policy}/status.
const (
	// StatusSynced: seen within StaleAfter (or polling now) and running the
	// current version.
	StatusSynced = "SYNCED"
	// StatusStale: not seen within StaleAfter, or running another version
	// than the current one.
	StatusStale = "STALE"
	// StatusNotSeen is the status of a policy no Envoy polls on this
	// replica (no entries).
	StatusNotSeen = "NOT SEEN"
)

// register records the poll of r in the registry if it names its Envoy, and
// returns the function to call when the poll ends.
func (s *Server) register(r *http.Request, policy string) func() {
	node := r.Header.Get(headerNode)
	if node == "" || s.o.Envoys == nil {
		return func() {}
	}
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	return s.o.Envoys.Begin(registry.Entry{Policy: policy, Node: node,
		Version: r.Header.Get(headerVersion), Build: r.Header.Get(headerBuild), Address: addr})
}

// envoyStatus is one element of "envoys" in GET /v1/policies/{policy}/status.
type envoyStatus struct {
	Node    string `json:"node"`
	Status  string `json:"status"`
	ETag    string `json:"etag,omitempty"`
	Version uint64 `json:"version"`
	Build   string `json:"build,omitempty"`
	Address string `json:"address,omitempty"`
	// LastSeen is when its last poll started or ended; Polling is true while
	// a poll is open (then it is connected now).
	LastSeen   time.Time `json:"last_seen"`
	AgeSeconds float64   `json:"age_seconds"`
	Polling    bool      `json:"polling"`
}

// statusBody is the body of GET /v1/policies/{policy}/status.
type statusBody struct {
	Policy            string        `json:"policy"`
	Exists            bool          `json:"exists"`
	Version           uint64        `json:"version"`
	ETag              string        `json:"etag,omitempty"`
	StaleAfterSeconds float64       `json:"stale_after_seconds"`
	Synced            int           `json:"synced"`
	Stale             int           `json:"stale"`
	Envoys            []envoyStatus `json:"envoys"`
	// RLS is what this replica's RateLimitService decided under the
	// policy's descriptor rules; absent when it has decided nothing.
	RLS *rlsStatus `json:"rls,omitempty"`
}

// rlsStatus is "rls" in GET /v1/policies/{policy}/status.
type rlsStatus struct {
	Decisions    int64     `json:"decisions"`
	LastDecision time.Time `json:"last_decision"`
	AgeSeconds   float64   `json:"age_seconds"`
}

func (s *Server) policyStatus(w http.ResponseWriter, r *http.Request, _ role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	rec, aerr := s.lookup(r.Context(), name)
	if aerr != nil {
		aerr.write(w)
		return
	}
	out := statusBody{Policy: name, Exists: rec.Exists(), StaleAfterSeconds: s.o.StaleAfter.Seconds(), Envoys: []envoyStatus{}}
	current := ""
	if rec.Exists() {
		current = etag(rec)
		out.Version, out.ETag = rec.Version, current
	}
	now := s.o.Now()
	if s.o.Envoys != nil {
		for _, e := range s.o.Envoys.Policy(name) {
			es := envoyStatus{Node: e.Node, ETag: e.Version, Build: e.Build, Address: e.Address,
				LastSeen: e.LastSeen.UTC(), Polling: e.Polling, Status: StatusStale}
			if e.Polling {
				es.AgeSeconds = 0
			} else {
				es.AgeSeconds = max(now.Sub(e.LastSeen), 0).Seconds()
			}
			es.Version, _, _ = parseTag(e.Version)
			if current != "" && e.Version == current && (e.Polling || now.Sub(e.LastSeen) <= s.o.StaleAfter) {
				es.Status = StatusSynced
				out.Synced++
			} else {
				out.Stale++
			}
			out.Envoys = append(out.Envoys, es)
		}
	}
	if s.o.RLSUse != nil {
		if n, last, ok := s.o.RLSUse(name); ok {
			out.RLS = &rlsStatus{Decisions: n, LastDecision: last.UTC(), AgeSeconds: max(now.Sub(last), 0).Seconds()}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// envoyCollector exports sluice_controlplane_envoys{policy,version}: the
// Envoys polling this replica per policy and per version they run. Its
// cardinality is bounded: the first MaxPolicyMetrics policies by name, each
// with at most maxVersionSeries version labels (the most common; the rest
// are summed as "other"; "none" is an Envoy that applied no version yet).
type envoyCollector struct {
	reg  *registry.Registry
	snap *snapshot.Snapshot
}

const maxVersionSeries = 4

var envoysDesc = prometheus.NewDesc("sluice_controlplane_envoys",
	"Envoys polling this replica by policy and by the policy version they run (bounded: first 100 policies by name, 4 versions each plus \"other\").",
	[]string{"policy", "version"}, nil)

func (c envoyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- envoysDesc }

func (c envoyCollector) Collect(ch chan<- prometheus.Metric) {
	if c.reg == nil {
		return
	}
	counts := map[string]map[string]int{}
	var policies []string
	for _, e := range c.reg.All() {
		m := counts[e.Policy]
		if m == nil {
			if len(policies) >= MaxPolicyMetrics {
				continue
			}
			m = map[string]int{}
			counts[e.Policy] = m
			policies = append(policies, e.Policy)
		}
		v := "none"
		if n, _, ok := parseTag(e.Version); ok {
			v = strconv.FormatUint(n, 10)
		}
		m[v]++
	}
	for _, p := range policies {
		type vc struct {
			v string
			n int
		}
		var list []vc
		for v, n := range counts[p] {
			list = append(list, vc{v, n})
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].n != list[j].n {
				return list[i].n > list[j].n
			}
			return list[i].v < list[j].v
		})
		other := 0
		for i, x := range list {
			if i >= maxVersionSeries {
				other += x.n
				continue
			}
			ch <- prometheus.MustNewConstMetric(envoysDesc, prometheus.GaugeValue, float64(x.n), p, x.v)
		}
		if other > 0 {
			ch <- prometheus.MustNewConstMetric(envoysDesc, prometheus.GaugeValue, float64(other), p, "other")
		}
	}
}
