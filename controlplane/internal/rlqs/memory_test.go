package rlqs

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestAFloodOfBucketsIsBoundedInCountAndBytes: one identity reporting 20,000
// buckets whose user ids are 4 KB each keeps at most its bound of them, each at a
// size that does not grow with its id (only a digest of the id is kept), the rest
// abandoned; entries the rule does not key on are refused, not kept; another
// identity's stream opened after the flood is served; and the count falls back
// when the streams end.
func TestAFloodOfBucketsIsBoundedInCountAndBytes(t *testing.T) {
	f := &fixture{pol: &policies{}, reg: prometheus.NewRegistry()}
	m := int64(time.Minute)
	f.now = time.Now().UnixNano()/m*m + m
	f.pol.set(t, simPolicy)
	clock := func() int64 { return f.now }
	f.q = quota.New(quota.Options{Backend: quota.NewMemory(), Policies: f.pol, Open: true, Now: clock, Timeout: time.Minute})
	f.srv = New(Options{Quota: f.q, Now: clock, Registry: f.reg, MaxBucketsPerStream: 10000, MaxBucketsPerIdentity: 15000, MaxBuckets: 25000})
	pad := strings.Repeat("p", 4<<10)
	before := heapInUse()
	var streams []*stream
	for n := 0; n < 2; n++ {
		ss := f.srv.newStream("flooder/")
		streams = append(streams, ss)
		for batch := 0; batch < 100; batch++ {
			var ids []map[string]string
			for i := 0; i < 100; i++ {
				ids = append(ids, map[string]string{"policy": "p", "rule": "fw", "user": pad + strconv.Itoa(n) + "-" + strconv.Itoa(batch*100+i)})
			}
			f.send(ss, report(simEnv, 0, 1, ids...))
		}
	}
	if got := gaugeValue(t, f.reg, "sluice_controlplane_rlqs_buckets"); got != 15000 {
		t.Fatalf("buckets tracked %v after the flood, want the identity's bound, 15000", got)
	}
	if got := counterWith(t, f.reg, "sluice_controlplane_rlqs_abandoned_total", "reason", ReasonTooManyBuckets); got != 5000 {
		t.Fatalf("abandoned as too many: %v, want 5000", got)
	}
	grown := heapInUse() - min(before, heapInUse())
	t.Logf("heap grew %d KiB for 15,000 buckets of 4 KiB ids (%d bytes a bucket)", grown>>10, grown/15000)
	if grown > 15000*2048 {
		t.Fatalf("heap grew %d bytes for 15,000 buckets: their 4 KiB ids are kept", grown)
	}
	// Entries the rule does not key on are refused.
	ss := f.srv.newStream("other/")
	resp := f.send(ss, report(simEnv, 0, 1, map[string]string{"policy": "p", "rule": "fw", "user": "u", "header:x-pad": pad}))
	if len(applied(resp)) != 1 || applied(resp)[0].GetAbandonAction() == nil || len(ss.buckets) != 0 {
		t.Fatalf("a bucket with an entry the rule does not key on: %.200v", resp)
	}
	// Another identity is served.
	resp = f.send(ss, report(simEnv, 0, 1, map[string]string{"policy": "p", "rule": "fw", "user": "legit"}))
	if len(applied(resp)) != 1 || applied(resp)[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("another identity after the flood: %.200v", resp)
	}
	for _, s := range append(streams, ss) {
		s.close()
	}
	if got := gaugeValue(t, f.reg, "sluice_controlplane_rlqs_buckets"); got != 0 {
		t.Fatalf("buckets tracked %v once every stream ended", got)
	}
}
