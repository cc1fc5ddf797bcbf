// Package monitoring reads the PromQL of sluice's Grafana dashboard
// (grafana-dashboard.json) and Prometheus alert rules (prometheus-rules.yaml)
// beside it, so that tests can check every series they name against what a
// running control plane and proxy serve.
package monitoring

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"sigs.k8s.io/yaml"
)

// Alert is one alerting rule of prometheus-rules.yaml.
type Alert struct {
	Alert, Expr, For string
	Labels           map[string]string
	Annotations      map[string]string
}

// Expressions returns every PromQL expression of a Grafana dashboard (each
// panel's targets[].expr) and of Prometheus rule groups (groups[].rules[].expr,
// decoded strictly), dashboard first, and the alerting rules.
func Expressions(dashboard, rules []byte) ([]string, []Alert, error) {
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(dashboard, &dash); err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	var rs struct {
		Groups []struct {
			Name  string
			Rules []Alert
		}
	}
	if err := yaml.UnmarshalStrict(rules, &rs); err != nil {
		return nil, nil, fmt.Errorf("rules: %w", err)
	}
	var alerts []Alert
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				return nil, nil, errors.New("rules: a rule without alert or expr")
			}
			alerts = append(alerts, r)
			exprs = append(exprs, r.Expr)
		}
	}
	return exprs, alerts, nil
}

var (
	nameMatcher = regexp.MustCompile(`__name__\s*=~\s*"([^"]+)"`)
	quoted      = regexp.MustCompile(`"[^"]*"`)
	bareName    = regexp.MustCompile(`\b(sluice_[a-z0-9_]+)\b`)
)

// Series returns the metric names an expression selects, as anchored regular
// expressions: each {__name__=~"..."} matcher, and each bare metric name
// (sluice_...) outside quotes, as an exact name. A name with a Prometheus
// histogram suffix (_bucket, _sum, _count) is kept as written: it is a series
// of its own.
func Series(expr string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for _, m := range nameMatcher.FindAllStringSubmatch(expr, -1) {
		re, err := regexp.Compile("^(?:" + m[1] + ")$")
		if err != nil {
			return nil, fmt.Errorf("%q: %w", m[1], err)
		}
		out = append(out, re)
	}
	for _, n := range bareName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		out = append(out, regexp.MustCompile("^"+regexp.QuoteMeta(n)+"$"))
	}
	return out, nil
}
