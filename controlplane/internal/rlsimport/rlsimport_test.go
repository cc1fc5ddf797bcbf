package rlsimport

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// The examples of envoyproxy/ratelimit's README, as they are written there.
const readmeExamples = `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`

const edge = `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
    detailed_metric: true
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      name: office-ip
      unit: Minute
      requests_per_unit: 100
  - key: to_cluster
    value: service_a
    descriptors:
      - key: from_cluster
        rate_limit:
          unit: hour
          requests_per_unit: 7
        shadow_mode: true
      - key: path
        value: /v1/*
        rate_limit: {unit: year, requests_per_unit: 3}
`

func TestEnvoyproxyRatelimitFilesBecomeOneRulePerLimit(t *testing.T) {
	res, err := Import("imported", []File{{"mongo.yaml", []byte(readmeExamples)}, {"edge.yaml", []byte(edge)}})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		id      string
		domain  string
		entries string
		limit   uint64
		window  time.Duration
		shadow  bool
	}
	wants := []want{
		{"mongo_cps.database_users", "mongo_cps", "database=users", 500, time.Second, false},
		{"mongo_cps.database_default", "mongo_cps", "database=default", 500, time.Second, false},
		{"edge_proxy_per_ip.remote_address", "edge_proxy_per_ip", "remote_address", 10, time.Second, false},
		{"office-ip", "edge_proxy_per_ip", "remote_address=50.0.0.5", 100, time.Minute, false},
		{"edge_proxy_per_ip.to_cluster_service_a.from_cluster", "edge_proxy_per_ip", "to_cluster=service_a,from_cluster", 7, time.Hour, true},
		{"edge_proxy_per_ip.to_cluster_service_a.path_-v1--", "edge_proxy_per_ip", "to_cluster=service_a,path=/v1/*", 3, 365 * 24 * time.Hour, false},
	}
	p := res.Policy
	if len(p.Rules) != len(wants) {
		t.Fatalf("%d rules, want %d:\n%s", len(p.Rules), len(wants), rules.EncodePolicy(p))
	}
	for i, w := range wants {
		r := p.Rules[i]
		var es []string
		for _, e := range r.Descriptor.Entries {
			s := e.Key
			if e.Value != "" {
				s += "=" + e.Value
			}
			es = append(es, s)
		}
		got := want{r.ID, r.Descriptor.Domain, strings.Join(es, ","), r.Limit, r.Window, r.Shadow}
		if got != w || r.Algorithm != "fixed_window" || r.Scope != "fleet" {
			t.Errorf("rule %d: got %+v (%s, %s), want %+v", i, got, r.Algorithm, r.Scope, w)
		}
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "edge.yaml:8: descriptors[0].detailed_metric") {
		t.Errorf("notes %q", res.Notes)
	}
	if _, err := rules.Compile(p, rules.CompileOptions{}); err != nil {
		t.Fatalf("the import does not compile: %v", err)
	}
}

// unlimited and replaces, as envoyproxy/ratelimit's README uses them.
func TestUnlimitedAndReplacesAreImported(t *testing.T) {
	res, err := Import("p", []File{{"f.yaml", []byte(`
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unlimited: true}
  - key: generic_key
    value: global
    rate_limit: {name: global, unit: minute, requests_per_unit: 100}
  - key: plan
    value: vip
    rate_limit:
      name: vip
      unit: minute
      requests_per_unit: 1000
      replaces: [{name: global}]
`)}})
	if err != nil {
		t.Fatal(err)
	}
	rs := res.Policy.Rules
	if !rs[1].Descriptor.Unlimited || rs[1].Algorithm != "" || rs[1].Scope != "" {
		t.Errorf("unlimited: %+v", rs[1])
	}
	if rs[2].ID != "global" || len(rs[3].Descriptor.Replaces) != 1 || rs[3].Descriptor.Replaces[0] != "global" {
		t.Errorf("replaces: %+v %+v", rs[2], rs[3].Descriptor)
	}
}

func TestWhatSluiceCannotExpressIsRefusedWithItsPlace(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"descriptors: []", "f.yaml:1: domain: required"},
		{"domain: d\ndescriptors:\n  - value: x\n    rate_limit: {unit: second, requests_per_unit: 1}", "f.yaml:3: descriptors[0].key: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "descriptors[0].rate_limit.unit: want one of"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0}", "descriptors[0].rate_limit.requests_per_unit: want at least 1"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "f.yaml:4: descriptors[0].rate_limit.unit: should not be given with unlimited"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: b}]}", "f.yaml:4: replaces: no rate_limit of domain \"d\" is named \"b\""},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}", "replaces should not contain the name of the same descriptor"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    rate_limit: {unit: second, requests_per_unit: 1}", "f.yaml:4: descriptors[0].value: a '*' before the end"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}", "descriptors[0].share_threshold: a counter shared"},
		{"domain: d\ndescriptors:\n  - key: k\n    colour: red", "f.yaml:4: descriptors[0].colour: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}", "f.yaml:6: descriptors[1].rate_limit: the same domain and descriptor as f.yaml:4"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -3}", "requests_per_unit: want a whole number"},
		{"domain: [d]", "f.yaml:1: domain: want a string"},
	} {
		_, err := Import("p", []File{{"f.yaml", []byte(tc.doc)}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want ...%s...", tc.doc, err, tc.want)
		}
	}
}
