package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

const raiseRule = `{"id":"api-per-user","match":{"path_prefix":"/api/"},"key":["user|client_ip"],"algorithm":"token_bucket","limit":%d,"window":"1m"}`

// TestWalkthrough is the README's walkthrough on real processes with a
// real Redis: a policy applied over REST, a burst with the exact number of
// 200s and 429s, the 429 checked, the access log checked field by field, a
// PUT that raises the limit, Redis killed and restarted, the control plane
// killed and restarted, with enforcement never stopping.
func TestWalkthrough(t *testing.T) {
	s := startStack(t, true)
	v1 := s.applyDemo()
	t.Logf("policy version %d in use after %s", v1, s.awaitVersion(v1))

	// The burst: 5 allowed, then denied.
	var codes []int
	for i := 1; i <= 8; i++ {
		r := s.get("GET", "/api/hello?n="+strconv.Itoa(i), "X-User-Id", "alice", "X-Request-Id", fmt.Sprintf("wt-%d", i), "User-Agent", "e2e")
		codes = append(codes, r.status)
		if i == 6 {
			check429(t, r, "wt-6")
		}
	}
	if fmt.Sprint(codes) != "[200 200 200 200 200 429 429 429]" {
		t.Fatalf("burst: %v, want five 200s then three 429s", codes)
	}
	for i := 1; i <= 8; i++ {
		checkLogLine(t, s.logOf(fmt.Sprintf("wt-%d", i)), i, v1)
	}

	// One PUT raises the limit; every worker enforces it within a second.
	start := time.Now()
	v2 := s.putOK("/v1/policies/default/rules/api-per-user", fmt.Sprintf(raiseRule, 100))
	n := 0
	if !proctest.WaitFor(10*time.Second, func() bool {
		n++
		return s.get("GET", "/api/hello", "X-User-Id", "alice").status == http.StatusOK
	}) {
		t.Fatalf("the raised limit (version %d) was not enforced within 10s", v2)
	}
	t.Logf("raised limit enforced %s after the PUT (%d requests)", time.Since(start), n)
	s.awaitVersion(v2)

	// Redis down: the last policy keeps being enforced; writes get 503.
	s.redis.Kill()
	if code, b := s.put("/v1/policies/default/rules/api-per-user", fmt.Sprintf(raiseRule, 7)); code != http.StatusServiceUnavailable {
		t.Fatalf("PUT with Redis down: %d %s, want 503", code, b)
	}
	enforced(t, s, "carol", 100, v2)
	// Redis back (same data): writes work again.
	s.redis.Restart()
	var v3 uint64
	if !proctest.WaitFor(20*time.Second, func() bool {
		code, b := s.put("/v1/policies/default/rules/api-per-user", fmt.Sprintf(raiseRule, 3))
		if code == http.StatusOK {
			json.Unmarshal(b, &struct{ Version *uint64 }{&v3})
		}
		return code == http.StatusOK
	}) {
		t.Fatal("writes still fail 20s after Redis restarted")
	}
	s.awaitVersion(v3)
	enforced(t, s, "dave", 3, v3)

	// Control plane down: enforcement goes on with the last policy.
	s.cp.Kill()
	enforced(t, s, "erin", 3, v3)
	s.cp.Start()
	proctest.AwaitHTTP(t, "http://"+s.cpAddr+"/readyz", readyTimeout, s.cp)
	v4 := s.putOK("/v1/policies/default/rules/api-per-user", fmt.Sprintf(raiseRule, 2))
	s.awaitVersion(v4)
	enforced(t, s, "frank", 2, v4)
}

// enforced sends requests as user until the first 429 and checks that the
// number admitted is what raiseRule's token bucket (capacity limit, refilled
// at limit per minute) allows over the burst's real duration: at least limit,
// at most limit plus the tokens refilled meanwhile. Every request must have
// been decided under policy version v.
func enforced(t *testing.T, s *stack, user string, limit int, v uint64) {
	t.Helper()
	start := time.Now()
	admitted := 0
	for i := 1; ; i++ {
		id := fmt.Sprintf("%s-%d", user, i)
		r := s.get("GET", "/api/x", "X-User-Id", user, "X-Request-Id", id)
		if got := rateLimit(s.logOf(id))["policy_version"]; got != strconv.FormatUint(v, 10) {
			t.Fatalf("%s request %d: policy version %v, want %d", user, i, got, v)
		}
		if r.status == http.StatusTooManyRequests {
			break
		}
		if r.status != http.StatusOK {
			t.Fatalf("%s request %d: %d, want 200 or 429 (limit %d, version %d)", user, i, r.status, limit, v)
		}
		admitted++
		if admitted > 2*limit+10 {
			t.Fatalf("%s: %d requests admitted and none limited (limit %d, version %d)", user, admitted, limit, v)
		}
	}
	refilled := int(time.Since(start).Seconds() * float64(limit) / 60)
	if admitted < limit || admitted > limit+refilled {
		t.Fatalf("%s: %d admitted before the first 429, want %d to %d (limit %d per minute over %s, version %d)",
			user, admitted, limit, limit+refilled, limit, time.Since(start), v)
	}
}

func check429(t *testing.T, r response, requestID string) {
	t.Helper()
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", r.status)
	}
	h := r.header
	if h.Get("Content-Type") != "application/json" || h.Get("X-Ratelimit-Limit") != "5" || h.Get("X-Ratelimit-Remaining") != "0" {
		t.Errorf("429 headers: %v", h)
	}
	ra, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 60 {
		t.Errorf("Retry-After %q", h.Get("Retry-After"))
	}
	var body struct {
		Code    int
		Message string
		Data    struct {
			Rule             string
			Limit, Remaining uint64
			Reset            uint64
		}
		Timestamp string
		TraceID   string `json:"trace_id"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("429 body %s: %v", r.body, err)
	}
	if body.Code != 429 || body.Message == "" || body.Data.Rule != "api-per-user" || body.Data.Limit != 5 ||
		body.Data.Remaining != 0 || body.TraceID != requestID {
		t.Errorf("429 body %s", r.body)
	}
	if _, err := time.Parse(time.RFC3339, body.Timestamp); err != nil {
		t.Errorf("429 timestamp %q: %v", body.Timestamp, err)
	}
}

// checkLogLine checks the access-log line of burst request i (1..8).
func checkLogLine(t *testing.T, m map[string]any, i int, v uint64) {
	t.Helper()
	limited := i > 5
	remaining := 5 - i
	if limited {
		remaining = 0
	}
	status := 200.0
	if limited {
		status = 429
	}
	want := map[string]any{
		"env": "e2e", "request_id": fmt.Sprintf("wt-%d", i), "user_id": "alice", "tenant_id": nil,
		"method": "GET", "path": "/api/hello", "query": "n=" + strconv.Itoa(i), "status_code": status,
		"client_ip": "127.0.0.1", "user_agent": "e2e", "traceparent": nil,
	}
	for k, w := range want {
		if g, ok := m[k]; !ok || g != w {
			t.Errorf("request %d: %s = %#v, want %#v", i, k, g, w)
		}
	}
	// rate_limit: every field of the README's table that applies, and
	// none that does not (scope, quota and reason are for fleet rules and
	// undecided requests; trace_id only with the local reply).
	wantRL := map[string]string{
		"rate_limited": strconv.FormatBool(limited), "rule": "api-per-user",
		"key": "rl:dev:default/api-per-user:user=alice:60s", "limit": "5",
		"remaining": strconv.Itoa(remaining), "shadow": "false", "policy_version": strconv.FormatUint(v, 10),
	}
	if limited {
		wantRL["trace_id"] = fmt.Sprintf("wt-%d", i) // the 429 body's trace_id
	}
	rl := rateLimit(m)
	reset, err := strconv.Atoi(rl["reset"])
	if err != nil || reset < 0 || reset > 60 {
		t.Errorf("request %d: rate_limit reset %q", i, rl["reset"])
	}
	delete(rl, "reset")
	if !maps.Equal(rl, wantRL) {
		t.Errorf("request %d: rate_limit %v, want %v and reset", i, rl, wantRL)
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", fmt.Sprint(m["timestamp"])); err != nil {
		t.Errorf("request %d: timestamp %v", i, m["timestamp"])
	}
	if d, ok := m["response_time_ms"].(float64); !ok || d < 0 {
		t.Errorf("request %d: response_time_ms %v", i, m["response_time_ms"])
	}
}
