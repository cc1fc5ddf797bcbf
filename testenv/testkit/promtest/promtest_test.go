package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCounterSumsTheSamplesOfALabelValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"k"})
	reg.MustRegister(c)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	if got := Counter(reg, "x_total", "k", "a"); got != 2 {
		t.Errorf("a: %v", got)
	}
	if got := Counter(reg, "x_total", "", ""); got != 5 {
		t.Errorf("all: %v", got)
	}
	if got := Counter(reg, "y_total", "", ""); got != 0 {
		t.Errorf("absent: %v", got)
	}
}
