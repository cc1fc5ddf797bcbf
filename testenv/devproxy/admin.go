package devproxy

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// envoyHistogramBuckets are Envoy's default histogram bucket bounds
// (source/common/stats/histogram_impl.cc, HistogramSettingsImpl::defaultBuckets),
// which /stats/prometheus prints as cumulative le buckets.
var envoyHistogramBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

// AdminHandler serves the endpoints of Envoy's admin interface that monitoring
// uses, for the proxy's filter:
//
//   - GET /ready: 200 "LIVE" (Envoy's answer once the server is initialized);
//   - GET /stats: one "name: value" line per stat, Envoy's plain format, the
//     filter's metrics without their "wasmcustom." prefix;
//   - GET /stats/prometheus: the Prometheus text exposition of the filter's
//     metrics as Envoy names them there: the custom-namespace prefix "wasmcustom."
//     stripped and no "envoy_" prefix added (PrometheusStatsFormatter::metricName,
//     source/server/admin/prometheus_stats.cc), every other byte than
//     [a-zA-Z0-9_] as "_"; histograms in Envoy's default buckets.
//
// Without a filter (pass-through) the stats are empty.
func (p *Proxy) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		_, _ = w.Write([]byte("LIVE\n"))
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		var b strings.Builder
		for _, m := range p.metrics() {
			fmt.Fprintf(&b, "%s: %d\n", m.name, m.Value)
		}
		_, _ = w.Write([]byte(b.String()))
	})
	mux.HandleFunc("GET /stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=UTF-8")
		_, _ = w.Write(p.prometheus())
	})
	return mux
}

type namedMetric struct {
	name string
	host.Metric
}

func (p *Proxy) metrics() []namedMetric {
	if p.h == nil {
		return nil
	}
	var out []namedMetric
	for _, n := range p.h.MetricNames() {
		if m, ok := p.h.Metric(n); ok {
			out = append(out, namedMetric{n, m})
		}
	}
	return out
}

// PrometheusName is the name Envoy's /stats/prometheus gives a custom (Wasm)
// metric: every byte outside [a-zA-Z0-9_] replaced by "_", no "envoy_" prefix.
func PrometheusName(stat string) string {
	b := []byte(stat)
	for i, c := range b {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			b[i] = '_'
		}
	}
	return string(b)
}

func (p *Proxy) prometheus() []byte {
	var b strings.Builder
	ms := p.metrics()
	sort.Slice(ms, func(i, j int) bool { return PrometheusName(ms[i].name) < PrometheusName(ms[j].name) })
	for _, m := range ms {
		name := PrometheusName(m.name)
		switch m.Type {
		case host.MetricCounter:
			fmt.Fprintf(&b, "# TYPE %s counter\n%s{} %d\n", name, name, m.Value)
		case host.MetricGauge:
			fmt.Fprintf(&b, "# TYPE %s gauge\n%s{} %d\n", name, name, m.Value)
		case host.MetricHistogram:
			fmt.Fprintf(&b, "# TYPE %s histogram\n", name)
			var sum float64
			for _, s := range m.Samples {
				sum += float64(s)
			}
			for _, le := range envoyHistogramBuckets {
				n := 0
				for _, s := range m.Samples {
					if float64(s) <= le {
						n++
					}
				}
				fmt.Fprintf(&b, "%s_bucket{le=\"%s\"} %d\n", name, strconv.FormatFloat(le, 'f', -1, 64), n)
			}
			fmt.Fprintf(&b, "%s_bucket{le=\"+Inf\"} %d\n%s_sum{} %s\n%s_count{} %d\n", name, len(m.Samples), name,
				strconv.FormatFloat(sum, 'f', -1, 64), name, len(m.Samples))
		}
	}
	return []byte(b.String())
}
