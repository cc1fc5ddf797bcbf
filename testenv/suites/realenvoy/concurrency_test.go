package realenvoy

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// concurrencyPolicy allows one request in flight per user on /slow (its
// slot's lease: a minute, far beyond the test); its probe rule lets
// awaitVersion see the version (probePath, per tenant: a probe without one
// is decided and logged, never counted).
const concurrencyPolicy = `{"policy":"default","identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},"rules":[` +
	`{"id":"one-in-flight","match":{"path_prefix":"/slow"},"key":["user"],"algorithm":"concurrency","limit":1,"lease":"1m"},` +
	`{"id":"probe","match":{"path_prefix":"/reports/"},"key":["tenant"],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`

// TestAConcurrencySlotIsFreedWhenItsStreamEnds: a concurrency rule's slot
// is taken back at the end of its stream, which the filter learns from
// proxy_on_delete (it exports neither proxy_on_log nor proxy_on_done), in
// the real Envoy and the dev proxy alike: one request in flight per user,
// so ten requests one after another are all admitted (a slot not given back
// would refuse the second for the lease's minute), a second request while
// a slow one is in flight is refused, and once the slow one has ended the
// next is admitted.
func TestAConcurrencySlotIsFreedWhenItsStreamEnds(t *testing.T) {
	cp := startControlPlane(t, "control plane", "--data-dir", t.TempDir())
	up := startUpstream(t)
	v := proctest.PutPolicy(t, cp.addr, "default", adminToken, concurrencyPolicy)
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			p := startProxy(t, kind, proxySpec{name: "concurrency", config: "envoy/envoy.yaml", upstream: up,
				clusters: map[string]string{"control_plane": cp.addr}})
			awaitVersion(t, p, v)
			for i := range 10 {
				if r := p.do(t, "GET", "/slow", "X-User-Id", "one-after-another"); r.status != http.StatusOK {
					t.Fatalf("request %d of one user, one after another: %d, want 200 (the previous slot was not freed)", i, r.status)
				}
			}
			user := "overlapping"
			var wg sync.WaitGroup
			wg.Add(1)
			slow := 0
			go func() {
				defer wg.Done()
				// A probe holds the slot while it runs, so the slow request
				// may be refused on its first tries: it retries until admitted.
				for try := 0; try < 50; try++ {
					if slow = p.do(t, "GET", "/slow?delay=3000", "X-User-Id", user).status; slow != http.StatusServiceUnavailable {
						return
					}
				}
			}()
			n := 0
			if !proctest.WaitFor(10*time.Second, func() bool {
				n++
				return p.do(t, "GET", "/slow", "X-User-Id", user, "X-Request-Id", "probe-"+strconv.Itoa(n)).status == http.StatusServiceUnavailable
			}) {
				t.Error("a second request while one is in flight was never refused")
			}
			wg.Wait()
			if slow != http.StatusOK {
				t.Errorf("the slow request: %d, want 200", slow)
			}
			if r := p.do(t, "GET", "/slow", "X-User-Id", user); r.status != http.StatusOK {
				t.Errorf("after the slow request ended: %d, want 200 (its slot was not freed)", r.status)
			}
		})
	}
}
