// Package promtest reads Prometheus counters from a registry, for the tests of
// the services that register them.
package promtest

import "github.com/prometheus/client_golang/prometheus"

// Counter returns the sum of the samples of counter name whose label has value
// (label "" sums every sample); 0 when there is none. It panics when the
// registry cannot be gathered (a test's registry always can).
func Counter(reg prometheus.Gatherer, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := label == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					ok = true
				}
			}
			if ok {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
