package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// TestDemoPolicy trips every rule of examples/default-policy.json the way
// the README's table says to, through the dev proxy (embedded store).
func TestDemoPolicy(t *testing.T) {
	s := startStack(t, false)
	v := s.applyDemo()
	s.awaitVersion(v)
	nonce := time.Now().UnixNano()

	// burst sends n requests and returns their statuses.
	burst := func(n int, method, path string, kv ...string) []int {
		var out []int
		for i := 0; i < n; i++ {
			out = append(out, s.get(method, path, kv...).status)
		}
		return out
	}
	expect := func(name string, got []int, want string) {
		t.Helper()
		if fmt.Sprint(got) != want {
			t.Errorf("%s: %v, want %s", name, got, want)
		}
	}
	expect("api-per-user (token_bucket)", burst(6, "GET", "/api/x", "X-User-Id", fmt.Sprint("bob-", nonce)), "[200 200 200 200 200 429]")
	expect("ops-bot is exempt", burst(7, "GET", "/api/x", "X-User-Id", "ops-bot"), "[200 200 200 200 200 200 200]")
	expect("login-per-ip (time_wheel)", burst(4, "POST", "/login"), "[200 200 200 429]")
	expect("reports-per-tenant-day (fixed_window)", burst(4, "GET", "/reports", "X-Tenant-Id", fmt.Sprint("acme-", nonce)), "[200 200 200 429]")
	expect("reports without a tenant are not counted", burst(4, "GET", "/reports"), "[200 200 200 200]")
	expect("fleet-per-user (fixed_window, fleet)", burst(12, "GET", "/fleet/x", "X-User-Id", fmt.Sprint("fay-", nonce)), "[200 200 200 200 200 200 200 200 200 200 429 429]")
	expect("export-exact (sliding_log)", burst(3, "GET", "/export", "X-User-Id", fmt.Sprint("eve-", nonce)), "[200 200 429]")
	// gcra, burst 2: three at once, then one per 500ms.
	if got := burst(6, "GET", "/search", "X-User-Id", fmt.Sprint("sam-", nonce)); fmt.Sprint(got[:3]) != "[200 200 200]" || got[5] != http.StatusTooManyRequests {
		t.Errorf("search-pace (gcra): %v, want three 200s then 429s", got)
	}
	// shadow: never rejects, logs that it would have.
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("shadow-%d-%d", nonce, i)
		if r := s.get("GET", "/admin", "X-Request-Id", id); r.status != http.StatusOK {
			t.Errorf("admin-shadow request %d: %d", i, r.status)
		}
		want := map[int]string{1: "false", 2: "true"}[i]
		if rl := rateLimit(s.logOf(id)); rl["shadow"] != want || rl["rate_limited"] != "false" {
			t.Errorf("admin-shadow request %d: shadow %v limited %v", i, rl["shadow"], rl["rate_limited"])
		}
	}

	// concurrency: two slow requests in flight, a third is refused (503).
	// A probe holds a slot for as long as it runs, so a slow request may be
	// refused while one is in flight: each retries until it is admitted.
	user := fmt.Sprint("slow-", nonce)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 0; try < 50; try++ {
				if s.get("GET", "/slow?delay=3000", "X-User-Id", user).status != http.StatusServiceUnavailable {
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // a head start, so the first probes rarely get in their way
	if !proctest.WaitFor(10*time.Second, func() bool { return s.get("GET", "/slow", "X-User-Id", user).status == http.StatusServiceUnavailable }) {
		t.Error("slow-in-flight (concurrency): a third request in flight was never refused")
	}
	wg.Wait()
	if r := s.get("GET", "/slow", "X-User-Id", user); r.status != http.StatusOK {
		t.Errorf("slow-in-flight: after the slow requests ended: %d, want 200 (slots released)", r.status)
	}

	// Clients that reset their streams release their slots too (on_done),
	// and the access log records response code 0 with flag DC, as Envoy.
	user = fmt.Sprint("reset-", nonce)
	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+s.proxyAddr+"/slow?delay=5000", nil)
		req.Header.Set("X-User-Id", user)
		req.Header.Set("X-Request-Id", fmt.Sprintf("reset-%d-%d", nonce, i))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("reset request %d: got %s, want the client's timeout", i, resp.Status)
		}
		cancel()
		if m := s.logOf(fmt.Sprintf("reset-%d-%d", nonce, i)); m["status_code"] != 0.0 {
			t.Errorf("reset request %d: status_code %v, want 0", i, m["status_code"])
		}
	}
	if r := s.get("GET", "/slow", "X-User-Id", user); r.status != http.StatusOK {
		t.Errorf("slow-in-flight: after two client resets: %d, want 200 (slots released)", r.status)
	}
}
