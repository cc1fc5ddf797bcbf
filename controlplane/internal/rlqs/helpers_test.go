package rlqs

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// counterWith returns the value of the sample of name whose label has value
// (label "" for the sum of all).
func counterWith(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
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

func mustRequest(t *testing.T, id map[string]string) *rules.Request {
	t.Helper()
	var parts []string // the rule keys on every entry the test names
	for name := range id {
		parts = append(parts, name)
	}
	r, reason := request(id, parts)
	if reason != "" {
		t.Fatal(reason)
	}
	return &r
}
