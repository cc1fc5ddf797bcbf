package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseDefaults(t *testing.T) {
	for _, doc := range []string{"", "  \n", "{}"} {
		c, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Errorf("%q: %+v, want defaults %+v", doc, c, Default())
		}
	}
	d := Default()
	if d.Env != "default" || d.Tick != 100*time.Millisecond || d.BucketsPerRule != 1024 || d.EntriesPerBucket != 16 ||
		d.Headers != HeadersXRateLimit || d.HeadersOnAllow || d.FailMode != FailOpen || d.CASRetries != 16 || d.CASFailMode != FailClosed || d.Policy != nil {
		t.Errorf("defaults %+v", d)
	}
}

func TestParseFull(t *testing.T) {
	doc := `{
	  "env": "prod",
	  "policy": {"policy": "default", "version": 4, "rules": [
	    {"id": "r", "key": ["client_ip"], "algorithm": "gcra", "limit": 10, "window": "1s", "description": "a \"quoted\" } ] , text"}]},
	  "control_plane": {"cluster": "control_plane", "authority": "cp.internal", "policy": "default",
	                    "token": "s3cret", "wait": "20s", "timeout": "25s", "lease": "3s", "first_policy_wait": "2s"},
	  "tick": "250ms", "trusted_hops": 0, "buckets_per_rule": 128, "entries_per_bucket": 32,
	  "headers": "both", "headers_on_allow": true, "fail_mode": "closed", "cas_retries": 20,
	  "cas_fail_mode": "open"
	}`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy == nil || c.Policy.Name != "default" || c.Policy.Version != 4 || c.Policy.Len() != 1 || c.Policy.Env() != "prod" {
		t.Fatalf("policy %+v", c.Policy)
	}
	c.Policy = nil
	want := Config{
		Env: "prod",
		ControlPlane: ControlPlane{Enabled: true, Cluster: "control_plane", Authority: "cp.internal", Policy: "default",
			Token: "s3cret", Wait: 20 * time.Second, Timeout: 25 * time.Second, Lease: 3 * time.Second,
			QuotaTimeout: DefaultQuotaTimeout, QuotaInterval: DefaultQuotaInterval, FirstPolicyWait: 2 * time.Second},
		Tick: 250 * time.Millisecond, BucketsPerRule: 128, EntriesPerBucket: 32,
		Headers: HeadersBoth, HeadersOnAllow: true, FailMode: FailClosed, CASRetries: 20, CASFailMode: FailOpen,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

func TestParseControlPlaneDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"control_plane":{"cluster":"cp"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := ControlPlane{Enabled: true, Cluster: "cp", Authority: "cp", Policy: "default", Wait: DefaultWait, Timeout: DefaultTimeout, Lease: DefaultLease,
		QuotaTimeout: DefaultQuotaTimeout, QuotaInterval: DefaultQuotaInterval, FirstPolicyWait: DefaultFirstPolicyWait}
	if c.ControlPlane != want {
		t.Errorf("%+v, want %+v", c.ControlPlane, want)
	}
	c, _ = Parse([]byte(`{"control_plane":{"cluster":"cp","wait":"1m"}}`))
	if c.ControlPlane.Timeout != time.Minute+5*time.Second {
		t.Errorf("timeout with wait 1m = %v", c.ControlPlane.Timeout)
	}
}

func TestParseQuotaSettings(t *testing.T) {
	c, err := Parse([]byte(`{"control_plane":{"cluster":"cp","quota_token":"q-tok","quota_timeout":"250ms","quota_interval":"500ms","envoy":"ingress-1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	cp := c.ControlPlane
	if cp.QuotaToken != "q-tok" || cp.QuotaTimeout != 250*time.Millisecond || cp.QuotaInterval != 500*time.Millisecond || cp.Envoy != "ingress-1" {
		t.Fatalf("%+v", cp)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`[]`, "must be an object"},
		{`{`, "config: "},
		{`{"x":1}`, "x: unknown field"},
		{`{"env":"Prod"}`, "env: must be"},
		{`{"env":7}`, "env: must be a string"},
		{`{"tick":"5ms"}`, "tick: must be 10ms..1m"},
		{`{"tick":100}`, "tick: "},
		{`{"trusted_hops":1}`, "trusted_hops: no longer supported: the client address is Envoy's trusted client address (source.address); set xff_num_trusted_hops"},
		{`{"trusted_hops":17}`, "trusted_hops: no longer supported"},
		{`{"trusted_hops":-1}`, "trusted_hops: no longer supported"},
		{`{"trusted_hops":"1"}`, "trusted_hops: "},
		{`{"buckets_per_rule":0}`, "buckets_per_rule: must be 1..4096"},
		{`{"entries_per_bucket":65}`, "entries_per_bucket: must be 1..64"},
		{`{"headers":"X-RateLimit"}`, `headers: must be "x-ratelimit"`},
		{`{"headers_on_allow":"yes"}`, "headers_on_allow: must be true or false"},
		{`{"fail_mode":"maybe"}`, `fail_mode: must be "open" or "closed"`},
		{`{"cas_retries":0}`, "cas_retries: must be 1..1000"},
		{`{"cas_fail_mode":"deny"}`, `cas_fail_mode: must be "open" or "closed"`},
		{`{"policy":[]}`, "policy: must be an object"},
		{`{"policy":{"policy":"p","rules":[{"id":"r","algorithm":"nope","limit":1}]}}`, "policy.rules[0].algorithm"},
		{`{"policy":{"policy":"p","rules":[],"extra":1}}`, "policy.extra: unknown field"},
		{`{"control_plane":{"authority":"a"}}`, "control_plane.cluster: required"},
		{`{"control_plane":{"cluster":"c","token_env":"1TOKEN"}}`, "control_plane.token_env: must be an environment variable name"},
		{`{"control_plane":{"cluster":"c","quota_token_env":"A-B"}}`, "control_plane.quota_token_env: must be an environment variable name"},
		{`{"control_plane":{"cluster":"c","token":"t","token_env":"T"}}`, "control_plane.token_env: set with token"},
		{`{"control_plane":{"cluster":"c","quota_token":"t","quota_token_env":"Q"}}`, "control_plane.quota_token_env: set with quota_token"},
		{`{"control_plane":{"cluster":"c","wait":"0.5s"}}`, "control_plane.wait: must be 1s..10m"},
		{`{"control_plane":{"cluster":"c","wait":"30s","timeout":"30s"}}`, "control_plane.timeout: must be greater than wait"},
		{`{"control_plane":{"cluster":"c","lease":"1h"}}`, "control_plane.lease: must be 100ms..1m"},
		{`{"control_plane":{"cluster":"c","token":"a b"}}`, "control_plane.token: must be visible ASCII"},
		{`{"control_plane":{"cluster":"c","policy":"A"}}`, "control_plane.policy: must be"},
		{`{"control_plane":{"cluster":"c","x":1}}`, "control_plane.x: unknown field"},
		{`{"control_plane":{"cluster":"c","quota_token":"a\nb"}}`, "control_plane.quota_token: must be visible ASCII"},
		{`{"control_plane":{"cluster":"c","quota_timeout":"1ms"}}`, "control_plane.quota_timeout: must be 10ms..10s"},
		{`{"control_plane":{"cluster":"c","quota_interval":"2m"}}`, "control_plane.quota_interval: must be 10ms..1m"},
		{`{"control_plane":{"cluster":"c","first_policy_wait":"11s"}}`, "control_plane.first_policy_wait: must be 0s..10s"},
		{`{"control_plane":{"cluster":"c","envoy":"in gress"}}`, "control_plane.envoy: must be"},
		{`{"entries_per_bucket":64,"policy":{"policy":"p","rules":[{"id":"r","algorithm":"sliding_log","limit":64,"window":"1s"}]}}`, "policy.rules[0]: a bucket of entries_per_bucket=64"},
	} {
		c, err := Parse([]byte(tc.doc))
		if err == nil {
			t.Errorf("%s: accepted: %+v", tc.doc, c)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v does not match ErrInvalid", tc.doc, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %q, want it to contain %q", tc.doc, err, tc.want)
		}
		if !reflect.DeepEqual(c, Config{}) {
			t.Errorf("%s: non-zero Config with an error", tc.doc)
		}
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`{"trusted_hops":99,"headers":"x","cas_retries":0}`))
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("%v: want 3 problems", err)
	}
	if errs[0].Field != "trusted_hops" || errs[1].Field != "headers" || errs[2].Field != "cas_retries" {
		t.Errorf("fields %v", errs)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"env":"prod","policy":{"policy":"p","rules":[{"id":"r","algorithm":"gcra","limit":1,"window":"1s"}]},"tick":"1s"}`))
	f.Add([]byte(`{"control_plane":{"cluster":"c"}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := Parse(doc)
		if err != nil && !reflect.DeepEqual(c, Config{}) {
			t.Fatal("non-zero Config with an error")
		}
	})
}

// TestFirstPolicyWaitZeroHoldsNone: "0s" is kept (no hold), not taken for
// the default.
func TestFirstPolicyWaitZeroHoldsNone(t *testing.T) {
	c, err := Parse([]byte(`{"control_plane":{"cluster":"cp","first_policy_wait":"0s"}}`))
	if err != nil || c.ControlPlane.FirstPolicyWait != 0 {
		t.Fatalf("first_policy_wait 0s: %v, %v", c.ControlPlane.FirstPolicyWait, err)
	}
	c, _ = Parse([]byte(`{"control_plane":{"cluster":"cp","first_policy_wait":"250ms"}}`))
	if c.ControlPlane.FirstPolicyWait != 250*time.Millisecond {
		t.Fatalf("first_policy_wait 250ms: %v", c.ControlPlane.FirstPolicyWait)
	}
}
