package main

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestShadowFleetLeaseDrainedAtCommitKeepsEnforcedCharge: an enforced rule is
// charged, then a shadow fleet rule's lease is spent by another worker between
// its read and its write. The shadow rule must not cost the enforced rule its
// charge: the request passes counted, and the next one is limited.
func TestShadowFleetLeaseDrainedAtCommitKeepsEnforcedCharge(t *testing.T) {
	doc := `{"policy":"p","version":1,"identity":{"user_header":"x-user-id"},"rules":[` +
		`{"id":"a","key":["user"],"algorithm":"fixed_window","limit":1,"window":"1h"},` +
		`{"id":"s","key":["user"],"algorithm":"fixed_window","limit":1000,"window":"1h","scope":"fleet","shadow":true}]}`
	cfg := `{"tick":"1s","policy":` + doc + `,"control_plane":{"cluster":"cp","policy":"p","quota_token":"q"}}`
	var h *host.Host
	var armed atomic.Bool
	hook := func(worker int, callback, op, key string) {
		if op == "set" && strings.Contains(key, "/s/") && strings.Contains(key, "/q"+strconv.Itoa(fleet.EntrySize)+fleet.Layout+"/") && armed.CompareAndSwap(true, false) {
			h.SetSharedData(key, nil) // another worker spent the lease meanwhile
		}
	}
	clock := host.NewVirtualClock(epoch)
	var err error
	h, err = host.New(context.Background(), host.Config{
		Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
		Workers: 1, Clock: clock, LogLevel: host.LogInfo, SharedDataHook: hook,
		Clusters: map[string]string{"cp": "127.0.0.1:1"}, // never answers: the static policy stays
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	e := &env{t: t, h: h, clock: clock}
	user := func(u string) req { return req{path: "/x", headers: host.Headers{{"x-user-id", u}}} }
	e.do(0, user("warm-up")) // the hash key and buckets exist now
	putLease(t, h, doc, 1, "gina", fleet.Entry{Held: 100, Expiry: epoch.Add(time.Hour).UnixNano()})

	armed.Store(true)
	if r := e.do(0, user("gina")); r.Status != 200 {
		t.Fatalf("first request: %d %v", r.Status, r.FilterState)
	}
	if armed.Load() {
		t.Fatal("the shadow rule's lease was never written: the test did not reach the race")
	}
	if r := e.do(0, user("gina")); r.Status != 429 || filterstate.Fields(r.FilterState)["rule"] != "a" {
		t.Fatalf("second request: %d %v; want 429 from rule a (its one unit was spent by the first)", r.Status, r.FilterState)
	}
}

// TestACutOffEnvoyAdmitsAtMostWhatTheWindowHadLeftForIt: a fixed window's
// lease entry holds what the quota service last said the window had left for
// this Envoy (fleet.Entry.Left); cut off from the service, the Envoy admits
// by itself at most that many in that window (each request counts at least
// ⌈L/left⌉ times in the local counter), none when it was 0, and in the next
// window, which no answer spoke of, its share of the whole limit again.
func TestACutOffEnvoyAdmitsAtMostWhatTheWindowHadLeftForIt(t *testing.T) {
	doc := `{"policy":"p","version":1,"identity":{"user_header":"x-user-id"},"rules":[` +
		`{"id":"f","key":["user"],"algorithm":"fixed_window","limit":100,"window":"1m","scope":"fleet"}]}`
	cfg := `{"tick":"1s","policy":` + doc + `,"control_plane":{"cluster":"cp","policy":"p","quota_token":"q"}}`
	for _, left := range []uint64{7, 0} {
		clock := host.NewVirtualClock(epoch)
		h, err := host.New(context.Background(), host.Config{
			Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice", PluginConfig: []byte(cfg),
			Workers: 1, Clock: clock, LogLevel: host.LogInfo,
			Clusters: map[string]string{"cp": "127.0.0.1:1"}, // never answers: cut off
		})
		if err != nil {
			t.Fatal(err)
		}
		e := &env{t: t, h: h, clock: clock}
		user := req{path: "/x", headers: host.Headers{{"x-user-id", "gina"}}}
		e.do(0, req{path: "/x", headers: host.Headers{{"x-user-id", "warm-up"}}}) // the hash key and buckets exist now
		putLease(t, h, doc, 0, "gina", fleet.Entry{Left: left, LeftUntil: epoch.Add(time.Minute).UnixNano()})

		count := func(n int) (admitted int) {
			for range n {
				r := e.do(0, user)
				if r.Status == 200 {
					admitted++
					if q := filterstate.Fields(r.FilterState)["quota"]; q != "degraded" {
						t.Fatalf("left %d: a request admitted with quota %q, want degraded (cut off)", left, q)
					}
				}
			}
			return admitted
		}
		got := count(30)
		if got > int(left) || (left > 0 && got == 0) {
			t.Errorf("left %d: admitted %d of 30 by itself in the window, want at most %d (and some)", left, got, left)
		}
		clock.Advance(time.Minute)
		if next := count(30); next <= int(left) {
			t.Errorf("left %d: admitted %d of 30 in the next window, want more (the share of the whole limit)", left, next)
		}
		t.Logf("left %d: admitted %d by itself in its window", left, got)
		h.Close()
	}
}

// putLease stores e, its Hash and Fingerprint filled in, as the lease entry of
// user's key of rule i of policy doc (named "p", keyed by user) in the shared
// data the filter's workers read, with the default table sizes.
func putLease(t *testing.T, h *host.Host, doc string, i int, user string, e fleet.Entry) {
	t.Helper()
	p, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := c.AppendKey(nil, i, &rules.Request{User: user})
	raw, _, _ := h.SharedData("sluice/hashkey")
	hk, ok := siphash.KeyFromBytes(raw)
	if !ok {
		t.Fatal("no hash key")
	}
	e.Hash, e.Fingerprint = siphash.Sum64(hk, key), c.Rule(i).Fingerprint
	buckets, entries := config.DefaultBucketsPerRule, config.DefaultEntriesPerBucket
	v, _ := fleet.Put(nil, nil, e, entries, 0)
	h.SetSharedData("sluice/p/"+c.Rule(i).ID+"/e"+strconv.Itoa(entries)+"b"+strconv.Itoa(buckets)+"/q"+strconv.Itoa(fleet.EntrySize)+fleet.Layout+"/"+strconv.Itoa(table.BucketOf(e.Hash, buckets)), v)
}
