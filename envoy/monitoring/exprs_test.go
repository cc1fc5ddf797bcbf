package monitoring

import (
	"os"
	"testing"
)

func TestSeriesNamesEachSelectedMetric(t *testing.T) {
	expr := `sum by (rule) (label_replace(rate({__name__=~"(?:envoy_(?:wasmcustom_)?)?sluice_rule_.+_allowed"}[1m]), "rule", "$1", "__name__", "sluice_x")) / histogram_quantile(0.99, sum by (le) (rate(sluice_controlplane_quota_request_duration_seconds_bucket[5m])))`
	res, err := Series(expr)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("%d series in %s: %v", len(res), expr, res)
	}
	for name, want := range map[string][2]bool{
		"sluice_rule_api_per_user_allowed":                          {true, false},
		"envoy_wasmcustom_sluice_rule_a_allowed":                    {true, false},
		"sluice_rule_a_limited":                                     {false, false},
		"sluice_controlplane_quota_request_duration_seconds_bucket": {false, true},
		"sluice_x": {false, false}, // inside quotes: a label_replace argument, not a series
	} {
		for i, re := range res {
			if re.MatchString(name) != want[i] {
				t.Errorf("series %d (%s) on %s: %t", i, re, name, !want[i])
			}
		}
	}
}

func TestTheShippedFilesParse(t *testing.T) {
	dash, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	exprs, alerts, err := Expressions(dash, rules)
	if err != nil || len(exprs) < 10 || len(alerts) < 5 {
		t.Fatalf("%d expressions, %d alerts: %v", len(exprs), len(alerts), err)
	}
	for _, e := range exprs {
		if s, err := Series(e); err != nil || len(s) == 0 {
			t.Errorf("%s: series %v, %v", e, s, err)
		}
	}
}
