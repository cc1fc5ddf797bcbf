package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/apitest"
	"github.com/sluice-proxy/sluice/controlplane/internal/registry"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type statusBody struct {
	Policy  string `json:"policy"`
	Exists  bool   `json:"exists"`
	Version uint64 `json:"version"`
	ETag    string `json:"etag"`
	Synced  int    `json:"synced"`
	Stale   int    `json:"stale"`
	Envoys  []struct {
		Node    string `json:"node"`
		Status  string `json:"status"`
		ETag    string `json:"etag"`
		Version uint64 `json:"version"`
		Build   string `json:"build"`
		Polling bool   `json:"polling"`
	} `json:"envoys"`
}

func getStatus(t *testing.T, c *apitest.Client, policy string) statusBody {
	t.Helper()
	r := c.Do("GET", "/v1/policies/"+policy+"/status", nil)
	expect(t, r, 200, "GET status")
	var s statusBody
	r.JSON(t, &s)
	return s
}

// TestStatusFollowsThePollingEnvoys: a long poll naming its Envoy puts it in
// the status, SYNCED while it runs the current version and polls or was
// seen recently, STALE when it runs an older version or was not seen for
// longer than StaleAfter.
func TestStatusFollowsThePollingEnvoys(t *testing.T) {
	clk := &testClock{t: time.Unix(1_700_000_000, 0)}
	reg := registry.New(registry.Options{Now: clk.now})
	r := startReplica(t, boltBackend(t), func(o *api.Options) {
		o.Envoys, o.StaleAfter, o.Now = reg, time.Minute, clk.now
	})
	if s := getStatus(t, r.read, "p"); s.Exists || len(s.Envoys) != 0 {
		t.Fatalf("unknown policy: %+v", s)
	}
	created := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 10))
	expect(t, created, 201, "PUT")
	v1 := created.ETag()

	// A poll that answers at once (the client has nothing) is recorded too.
	expect(t, r.read.Do("GET", "/v1/policies/p?wait=1s", nil, "X-Sluice-Node", "envoy-a", "X-Sluice-Build", "test-1"), 200, "first poll")
	// envoy-b holds a long poll with the current version.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pollDone := make(chan *apitest.Response, 1)
	go func() {
		pollDone <- r.read.DoContext(ctx, "GET", "/v1/policies/p?wait=15s", nil,
			"If-None-Match", v1, "X-Sluice-Node", "envoy-b", "X-Sluice-Version", v1)
	}()
	var s statusBody
	for i := 0; ; i++ {
		s = getStatus(t, r.read, "p")
		if len(s.Envoys) == 2 && s.Envoys[1].Polling {
			break
		}
		if i > 2000 {
			t.Fatalf("the long poll was not registered: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s.ETag != v1 || s.Envoys[0].Node != "envoy-a" || s.Envoys[0].Status != api.StatusStale || s.Envoys[0].Build != "test-1" ||
		s.Envoys[1].Node != "envoy-b" || s.Envoys[1].Status != api.StatusSynced || s.Envoys[1].Version != 1 || s.Synced != 1 || s.Stale != 1 {
		t.Fatalf("status %+v", s)
	}

	// A new version wakes the poll; envoy-b is STALE until it polls with it.
	upd := r.admin.Do("PUT", "/v1/policies/p", policyDoc("p", 20))
	expect(t, upd, 200, "PUT v2")
	expect(t, <-pollDone, 200, "woken poll")
	if s := getStatus(t, r.read, "p"); s.Envoys[1].Status != api.StatusStale || s.Envoys[1].Polling {
		t.Fatalf("after the change: %+v", s)
	}
	expect(t, r.read.Do("GET", "/v1/policies/p?wait=1ms", nil, "If-None-Match", upd.ETag(),
		"X-Sluice-Node", "envoy-b", "X-Sluice-Version", upd.ETag()), 304, "poll v2")
	if s := getStatus(t, r.read, "p"); s.Envoys[1].Status != api.StatusSynced || s.Envoys[1].Version != 2 {
		t.Fatalf("after polling v2: %+v", s)
	}
	// Not seen for longer than StaleAfter: STALE.
	clk.add(61 * time.Second)
	if s := getStatus(t, r.read, "p"); s.Envoys[1].Status != api.StatusStale || s.Synced != 0 {
		t.Fatalf("after StaleAfter: %+v", s)
	}
	// Metrics: Envoys per policy and version they run.
	m := r.anon.Do("GET", "/metrics", nil)
	for _, want := range []string{`sluice_controlplane_envoys{policy="p",version="2"} 1`, `sluice_controlplane_envoys{policy="p",version="none"} 1`} {
		if !bytes.Contains(m.Body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A plain GET (no wait) is never recorded.
	expect(t, r.read.Do("GET", "/v1/policies/p", nil, "X-Sluice-Node", "curl"), 200, "plain GET")
	if s := getStatus(t, r.read, "p"); len(s.Envoys) != 2 {
		t.Fatalf("a plain GET was registered: %+v", s)
	}
}

// TestDryRunWritesNothing: PUT ?dry_run=true validates and answers what would
// be stored, with the current ETag, and the policy is unchanged.
func TestDryRunWritesNothing(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	c := r.admin
	dry := c.Do("PUT", "/v1/policies/p?dry_run=true", policyDoc("p", 10))
	expect(t, dry, 201, "dry-run create")
	if dry.Header.Get("X-Sluice-Dry-Run") != "true" || dry.ETag() != "" {
		t.Fatalf("headers %v", dry.Header)
	}
	expect(t, c.Do("GET", "/v1/policies/p", nil), 404, "nothing created")
	created := c.Do("PUT", "/v1/policies/p", policyDoc("p", 10))
	expect(t, created, 201, "create")

	dry = c.Do("PUT", "/v1/policies/p?dry_run=true", policyDoc("p", 20), "If-Match", created.ETag())
	expect(t, dry, 200, "dry-run change")
	var p policyBody
	if err := json.Unmarshal(dry.Body, &p); err != nil || p.Version != 2 || p.Rules[0].Limit != 20 || dry.ETag() != created.ETag() {
		t.Fatalf("dry run answered %s (ETag %s)", dry.Body, dry.ETag())
	}
	if got := c.Do("GET", "/v1/policies/p", nil); got.ETag() != created.ETag() || !bytes.Equal(got.Body, created.Body) {
		t.Fatalf("dry run changed the policy: %s", got.Body)
	}
	expectCode(t, c.Do("PUT", "/v1/policies/p?dry_run=true", policyDoc("p", 20), "If-Match", `"v9.x.y"`), 412, "precondition_failed", "dry-run stale If-Match")
	expectCode(t, c.Do("PUT", "/v1/policies/p?dry_run=true", []byte(`{"rules":[{"id":"r1","algorithm":"fixed_window","limit":-1,"window":"1m"}]}`)),
		400, "invalid_document", "dry-run invalid")
	expectCode(t, c.Do("PUT", "/v1/policies/p?dry_run=maybe", policyDoc("p", 20)), 400, "invalid_parameter", "dry_run=maybe")
	expectCode(t, r.read.Do("PUT", "/v1/policies/p?dry_run=true", policyDoc("p", 20)), 403, "forbidden", "dry run needs the admin token")
	same := c.Do("PUT", "/v1/policies/p?dry_run=1", policyDoc("p", 10))
	expect(t, same, 200, "dry-run unchanged")
	if same.Header.Get("X-Sluice-Dry-Run") != "true" || same.ETag() != created.ETag() {
		t.Fatalf("unchanged dry run: %v", same.Header)
	}
	if h := c.Do("GET", "/v1/policies/p/versions", nil); !bytes.Contains(h.Body, []byte(`"current":1`)) {
		t.Fatalf("history %s", h.Body)
	}
}

// TestEnvoyMetricsAreBounded: at most 4 version series per policy (the most
// common), the rest summed as "other".
func TestEnvoyMetricsAreBounded(t *testing.T) {
	reg := registry.New(registry.Options{})
	r := startReplica(t, boltBackend(t), func(o *api.Options) { o.Envoys = reg })
	for v := 1; v <= 6; v++ {
		for n := 0; n < 7-v; n++ {
			reg.Begin(registry.Entry{Policy: "p", Node: fmt.Sprintf("n%d-%d", v, n), Version: fmt.Sprintf(`"v%d.e.s"`, v)})()
		}
	}
	m := string(r.anon.Do("GET", "/metrics", nil).Body)
	if got := strings.Count(m, "sluice_controlplane_envoys{"); got != 5 {
		t.Fatalf("%d series, want 5:\n%s", got, m)
	}
	for _, want := range []string{`{policy="p",version="1"} 6`, `{policy="p",version="4"} 3`, `{policy="p",version="other"} 3`} {
		if !strings.Contains(m, "sluice_controlplane_envoys"+want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
