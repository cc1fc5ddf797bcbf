package main

import (
	"context"
	"strconv"
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

// fleetBenchRule is one rule per user that no benchmark exhausts; the fleet
// variant holds a lease seeded in shared data, so every request spends from
// it (the warm path: no call).
const fleetBenchRule = `{"id":"r0","key":["user"],"algorithm":"fixed_window","limit":1000000000000,"window":"1h"`

// BenchmarkFleetWarm compares the same rule with envoy scope and with fleet
// scope on a warm key, in the BenchmarkRequest harness:
//
//	go test ./filter -run '^$' -bench 'FleetWarm' -benchmem -count 6
func BenchmarkFleetWarm(b *testing.B) {
	sluice := buildWasmTB(b)
	for _, bc := range []struct{ name, rule string }{
		{"envoy", fleetBenchRule + `}`},
		{"fleet", fleetBenchRule + `,"scope":"fleet"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			doc := benchPolicy(bc.rule)
			h := benchHost(b, sluice, `{"tick":"1m","policy":`+doc+`}`)
			w := h.Worker(0)
			ctx := context.Background()
			r := host.Request{Path: "/v1/api/items", Headers: host.Headers{{"x-user-id", "hot"}},
				Info: host.StreamInfo{SourceAddress: "203.0.113.7:40000"}}
			if _, err := w.Do(ctx, r); err != nil { // the hash key and buckets exist now
				b.Fatal(err)
			}
			if bc.name == "fleet" {
				seedLease(b, h, doc, "hot")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := w.Do(ctx, r)
				if err != nil || resp.Status != 200 {
					b.Fatalf("request %d: %d %v", i, resp.Status, err)
				}
				if bc.name == "fleet" && i == 0 && filterstate.Fields(resp.FilterState)["quota"] != "local" {
					b.Fatalf("not spent from the lease: %v", resp.FilterState)
				}
			}
		})
	}
}

// seedLease stores a lease of 10^12 units for user's key of the policy's
// first rule, valid for an hour of the virtual clock.
func seedLease(b testing.TB, h *host.Host, doc, user string) {
	b.Helper()
	p, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		b.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	key, ok := c.AppendKey(nil, 0, &rules.Request{User: user})
	if !ok {
		b.Fatal("no key")
	}
	raw, _, ok := h.SharedData("sluice/hashkey")
	hk, ok2 := siphash.KeyFromBytes(raw)
	if !ok || !ok2 {
		b.Fatal("no hash key")
	}
	hash := siphash.Sum64(hk, key)
	buckets, entries := config.DefaultBucketsPerRule, config.DefaultEntriesPerBucket
	n := table.BucketOf(hash, buckets)
	e := fleet.Entry{Hash: hash, Held: 1_000_000_000_000, Expiry: epoch.Add(time.Hour).UnixNano(), Fingerprint: c.Rule(0).Fingerprint}
	v, _ := fleet.Put(nil, nil, e, entries, 0)
	layout := "e" + strconv.Itoa(entries) + "b" + strconv.Itoa(buckets)
	h.SetSharedData("sluice/bench/r0/"+layout+"/q"+strconv.Itoa(fleet.EntrySize)+fleet.Layout+"/"+strconv.Itoa(n), v)
}
