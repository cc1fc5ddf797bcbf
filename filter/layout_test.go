package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// bucketKeyOf is the shared-data key of bucket n of rule in policy under
// the layout entries_per_bucket × buckets_per_rule.
func bucketKeyOf(policy, rule string, entries, buckets, n int) string {
	return "sluice/" + policy + "/" + rule + "/e" + strconv.Itoa(entries) + "b" + strconv.Itoa(buckets) + "/" + strconv.Itoa(n)
}

// newEnvSharing starts another filter configuration in the Envoy of e: its
// own VMs (a canary and workers), the same vm_id and so the same shared
// data, and e's clock.
func newEnvSharing(t testing.TB, e *env, cfg string, workers int) *env {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{
		Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice-2", PluginConfig: []byte(cfg),
		Workers: workers, Clock: e.clock, LogLevel: host.LogInfo, ShareWith: e.h,
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return &env{t: t, h: h, clock: e.clock}
}

// TestPluginConfigsWithDifferentLayoutsKeepTheirCounters: two filter
// configurations of one Envoy share a vm_id and a policy but not a bucket
// layout (an operator changing entries_per_bucket or buckets_per_rule, with
// the old configuration still draining). Each keeps exact counters of its
// own: one never wipes the other's buckets, and a client is counted once
// per configuration, whichever bucket its key falls in.
func TestPluginConfigsWithDifferentLayoutsKeepTheirCounters(t *testing.T) {
	buildWasm(t)
	const pol = `{"policy":"p","rules":[{"id":"k","key":["header:x-k"],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`
	for _, tc := range []struct {
		name   string
		layout [2][2]int // entries, buckets of configurations A and B
	}{
		{"entries_per_bucket differs", [2][2]int{{4, 1}, {8, 1}}},
		{"buckets_per_rule differs", [2][2]int{{8, 1}, {8, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := func(l [2]int) string {
				return `{"tick":"1m","entries_per_bucket":` + strconv.Itoa(l[0]) + `,"buckets_per_rule":` + strconv.Itoa(l[1]) +
					`,"policy":` + pol + `}`
			}
			a := newEnv(t, cfg(tc.layout[0]), 1)
			b := newEnvSharing(t, a, cfg(tc.layout[1]), 1)
			const keys = 4
			send := func(e *env, k int) int {
				return e.do(0, req{path: "/", headers: host.Headers{{"x-k", "client-" + strconv.Itoa(k)}}}).Status
			}
			// Configuration A counts every key to its limit.
			for k := range keys {
				for i := range 2 {
					if s := send(a, k); s != 200 {
						t.Fatalf("A, key %d, request %d: %d, want 200", k, i, s)
					}
				}
			}
			// B counts its own: every key is admitted to the limit, then denied.
			for k := range keys {
				for i := range 2 {
					if s := send(b, k); s != 200 {
						t.Fatalf("B, key %d, request %d: %d, want 200 (A's counters leaked into B's)", k, i, s)
					}
				}
				if s := send(b, k); s != 429 {
					t.Fatalf("B, key %d, request 3: %d, want 429", k, s)
				}
			}
			// A's counters survived B's traffic.
			for k := range keys {
				if s := send(a, k); s != 429 {
					t.Fatalf("A, key %d, request 3 after B's traffic: %d, want 429 (B wiped A's buckets)", k, s)
				}
			}
			for i, l := range tc.layout {
				for n := range l[1] {
					if _, _, ok := a.h.SharedData(bucketKeyOf("p", "k", l[0], l[1], n)); !ok {
						t.Errorf("configuration %c: bucket %s absent", 'A'+i, bucketKeyOf("p", "k", l[0], l[1], n))
					}
				}
			}
		})
	}
}
