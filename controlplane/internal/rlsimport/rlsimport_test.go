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
	res, err := Import("imported", []File{{"mongo.yaml", []byte(readmeExamples)}, {"edge.yaml", []byte(edge)}}, Options{})
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
`)}}, Options{})
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

func TestWhatEnvoyproxyRatelimitRefusesIsRefusedWithItsPlace(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"descriptors: []", "f.yaml:1: domain: required"},
		{"domain: d\ndescriptors:\n  - value: x\n    rate_limit: {unit: second, requests_per_unit: 1}", "f.yaml:3: descriptors[0].key: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "descriptors[0].rate_limit.unit: want one of"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "f.yaml:4: descriptors[0].rate_limit.unit: should not be given with unlimited"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: b}]}", "f.yaml:4: replaces: no rate_limit of domain \"d\" is named \"b\""},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}", "replaces should not contain the name of the same descriptor"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}", "f.yaml:5: descriptors[0].share_threshold: only with a value ending in '*'"},
		{"domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}", "f.yaml:4: descriptors[0].metadata: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v", "f.yaml:5: descriptors[1]: the key and value \"k_v\" again at this level"},
		{"domain: d\ndescriptors:\n  - key: k\n    colour: red", "f.yaml:4: descriptors[0].colour: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}", "f.yaml:5: descriptors[1]: the key and value \"k\" again at this level (also f.yaml:3"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -3}", "requests_per_unit: want a whole number"},
		{"domain: [d]", "f.yaml:1: domain: want a string"},
	} {
		_, err := Import("p", []File{{"f.yaml", []byte(tc.doc)}}, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want ...%s...", tc.doc, err, tc.want)
		}
	}
}

// What envoyproxy/ratelimit loads and sluice once refused: a limit of 0 (or
// none), a '*' inside a value (a character there), share_threshold,
// quota_mode, a value without a rate_limit, names, an empty descriptors, and
// one domain in two files when merging is asked for (refused without).
func TestEveryFileEnvoyproxyRatelimitLoadsImports(t *testing.T) {
	res, err := Import("p", []File{{"a.yaml", []byte(`
domain: d
descriptors:
  - key: banned
    rate_limit: {name: ban, unit: minute, requests_per_unit: 0}
  - key: unset
    rate_limit: {unit: hour}
  - key: mid
    value: bar*b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: k2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: k2
    value: free
  - key: empty
    descriptors:
`)}, {"b.yaml", []byte("domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: day, requests_per_unit: 3}\n")}}, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]*rules.Rule{}
	for i := range res.Policy.Rules {
		r := &res.Policy.Rules[i]
		byPath[pathText(r.Descriptor.Entries)] = r
	}
	if r := byPath["banned"]; r == nil || r.Limit != 0 || r.Algorithm != "fixed_window" || r.Descriptor.Name != "ban" {
		t.Errorf("requests_per_unit 0: %+v", r)
	}
	if r := byPath["unset"]; r == nil || r.Limit != 0 || r.Window != time.Hour {
		t.Errorf("no requests_per_unit: %+v", r)
	}
	if r := byPath["mid_bar*b"]; r == nil || !r.Descriptor.Entries[0].Exact() {
		t.Errorf("a '*' inside a value: %+v", r)
	}
	if r := byPath["files_files/*"]; r == nil || !r.Descriptor.Entries[0].Shared || !r.Descriptor.QuotaMode {
		t.Errorf("share_threshold and quota_mode: %+v", r)
	}
	if r := byPath["k2_free"]; r == nil || !r.Descriptor.NoLimit || r.Algorithm != "" {
		t.Errorf("a value without rate_limit: %+v", r)
	}
	if r := byPath["empty"]; r == nil || !r.Descriptor.NoLimit {
		t.Errorf("descriptors: with nothing: %+v", r)
	}
	if r := byPath["other"]; r == nil || r.Descriptor.Domain != "d" {
		t.Errorf("the merged file: %+v", r)
	}
	_, err = Import("p", []File{{"a.yaml", []byte("domain: d\ndescriptors: []\n")}, {"b.yaml", []byte("domain: d\ndescriptors: []\n")}}, Options{})
	if err == nil || !strings.Contains(err.Error(), `b.yaml:1: domain: domain "d" is also in a.yaml`) || !strings.Contains(err.Error(), "--merge-domains") {
		t.Errorf("one domain in two files without merging: %v", err)
	}
}
