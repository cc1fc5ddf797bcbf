package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// openStream delivers request headers on a new stream of worker w and
// leaves the stream open (a request in flight).
func (e *env) openStream(w int, path, user string) (*host.Stream, host.Status) {
	e.t.Helper()
	s, err := e.h.Worker(w).NewStream(host.StreamInfo{SourceAddress: "203.0.113.7:40000"})
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := s.RequestHeaders(context.Background(), host.Headers{
		{":method", "POST"}, {":path", path}, {":authority", "api"}, {":scheme", "http"}, {"x-user-id", user},
	}, true)
	if err != nil {
		e.t.Fatal(err)
	}
	return s, st
}

func (e *env) finish(s *host.Stream, withResponse bool) {
	e.t.Helper()
	ctx := context.Background()
	if withResponse {
		if _, err := s.ResponseHeaders(ctx, host.Headers{{":status", "200"}}, true); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := s.Finish(ctx); err != nil {
		e.t.Fatal(err)
	}
}

const seedUserPolicy = `{"policy":"seed","version":1,
 "identity":{"user_header":"x-user-id","tenant_header":"x-tenant-id"},
 "response_headers":{"set":"x-ratelimit","on_allow":true},
 "rules":[
  {"id":"user-rate","match":{"path_prefix":"/v1/api/"},"key":["user"],"algorithm":"time_wheel","limit":5,"window":"15s","slots":15},
  {"id":"user-tasks","match":{"path_prefix":"/v1/tasks"},"key":["user"],"algorithm":"concurrency","limit":30,"lease":"10m"}
 ]}`

// TestSeedPerUser: 5 requests per 15 s per user (the 6th in the window is
// 429), and at most 30 concurrent tasks per user (the 31st is 503; capacity
// comes back when streams end, including streams reset before a response).
func TestSeedPerUser(t *testing.T) {
	buildWasm(t)
	e := newEnv(t, `{"env":"prod","tick":"1m","policy":`+seedUserPolicy+`}`, 2)
	alice := host.Headers{{"x-user-id", "alice"}}
	for i := 1; i <= 5; i++ {
		resp := e.do(i%2, req{path: "/v1/api/items", headers: alice})
		if resp.Status != 200 {
			t.Fatalf("request %d: status %d", i, resp.Status)
		}
		wantHeaders(t, resp.Headers, map[string]string{
			"x-ratelimit-limit": "5", "x-ratelimit-remaining": strconv.Itoa(5 - i), "x-ratelimit-reset": "15",
		})
		e.clock.Advance(time.Second)
	}
	resp := e.do(0, req{path: "/v1/api/items", headers: alice})
	if resp.Status != 429 {
		t.Fatalf("6th request in the window: status %d, want 429", resp.Status)
	}
	// The window is 15 slots of 1 s; the first request (t=0) leaves the
	// window at t=15s, now is t=5s: Retry-After 10.
	wantHeaders(t, resp.Headers, map[string]string{
		"retry-after": "10", "x-ratelimit-limit": "5", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "14",
		"content-type": "application/json",
	})
	wantState(t, resp.FilterState, map[string]string{
		"sluice.rate_limited": "true", "sluice.rule": "user-rate", "sluice.key": "rl:prod:seed/user-rate:user=alice:15s",
		"sluice.limit": "5", "sluice.remaining": "0", "sluice.reset": "14", "sluice.shadow": "false", "sluice.policy_version": "1",
	})
	b := decodeReply(t, resp)
	if b.Code != 429 || b.Data.Rule != "user-rate" || b.Data.Limit != 5 || b.Data.Remaining != 0 || b.Data.Reset != 14 || b.TraceID == "" {
		t.Errorf("body %+v", b)
	}
	// Another user is not affected.
	if resp := e.do(1, req{path: "/v1/api/items", headers: host.Headers{{"x-user-id", "bob"}}}); resp.Status != 200 {
		t.Errorf("bob: status %d", resp.Status)
	}
	e.clock.Advance(10 * time.Second)
	if resp := e.do(0, req{path: "/v1/api/items", headers: alice}); resp.Status != 200 {
		t.Errorf("after Retry-After: status %d, want 200", resp.Status)
	}

	// 30 tasks in flight, spread over both workers.
	var open []*host.Stream
	for i := 0; i < 30; i++ {
		s, st := e.openStream(i%2, "/v1/tasks/run", "alice")
		if st != host.Continue {
			t.Fatalf("task %d: %v, want Continue", i+1, st)
		}
		open = append(open, s)
	}
	s31, st := e.openStream(0, "/v1/tasks/run", "alice")
	if st != host.Replied || s31.LocalReply() == nil || s31.LocalReply().Status != 503 {
		t.Fatalf("31st concurrent task: %v %+v, want a 503 local reply", st, s31.LocalReply())
	}
	b = decodeReply(t, host.Response{LocalReply: s31.LocalReply()})
	if b.Code != 503 || b.Message != "too many concurrent requests" || b.Data.Rule != "user-tasks" || b.Data.Limit != 30 || b.Data.Remaining != 0 {
		t.Errorf("31st body %+v", b)
	}
	wantHeaders(t, s31.LocalReply().Headers, map[string]string{"x-ratelimit-limit": "30", "x-ratelimit-remaining": "0"})
	e.finish(s31, false)
	// Bob has his own 30.
	sb, st := e.openStream(1, "/v1/tasks/run", "bob")
	if st != host.Continue {
		t.Fatalf("bob's task: %v", st)
	}
	e.finish(sb, true)
	// One task ends normally, one is reset before any response: two slots.
	e.finish(open[0], true)
	e.finish(open[1], false)
	for i := 0; i < 2; i++ {
		s, st := e.openStream(i, "/v1/tasks/run", "alice")
		if st != host.Continue {
			t.Fatalf("after two streams ended, task %d: %v, want Continue", i, st)
		}
		open = append(open, s)
	}
	if s, st := e.openStream(0, "/v1/tasks/run", "alice"); st != host.Replied {
		t.Fatalf("33rd while 30 in flight: %v, want Replied", st)
	} else {
		e.finish(s, false)
	}
	for _, s := range open[2:] {
		e.finish(s, true)
	}
	// All released: 30 fit again.
	for i := 0; i < 30; i++ {
		s, st := e.openStream(i%2, "/v1/tasks/run", "alice")
		if st != host.Continue {
			t.Fatalf("after all ended, task %d: %v", i, st)
		}
		defer e.finish(s, true)
	}
	if got := e.metric("sluice.rule.user-tasks.limited"); got != 2 {
		t.Errorf("user-tasks limited = %d, want 2", got)
	}
}

// TestConcurrencyLeaseReclaimsLostRelease: a slot whose release never comes
// is reclaimed when its lease expires.
func TestConcurrencyLeaseReclaimsLostRelease(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[{"id":"c","key":["user"],"algorithm":"concurrency","limit":1,"lease":"30s"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	if _, st := e.openStream(0, "/a", "u"); st != host.Continue { // never finished
		t.Fatalf("first: %v", st)
	}
	s, st := e.openStream(0, "/a", "u")
	if st != host.Replied {
		t.Fatalf("second while the first holds the slot: %v", st)
	}
	wantHeaders(t, s.LocalReply().Headers, map[string]string{"retry-after": "30"})
	e.finish(s, false)
	e.clock.Advance(30 * time.Second)
	if s, st := e.openStream(0, "/a", "u"); st != host.Continue {
		t.Fatalf("after the lease: %v, want Continue", st)
	} else {
		e.finish(s, true)
	}
}

const seedLoginPolicy = `{"policy":"edge","version":7,
 "identity":{"tenant_header":"x-tenant-id"},
 "rules":[
  {"id":"login-per-ip","match":{"path_prefix":"/v1/auth/login","methods":["POST"]},"key":["client_ip"],"algorithm":"time_wheel","limit":10,"window":"5m","slots":30},
  {"id":"lowcode-tenant","match":{"path_prefix":"/v1/lowcode/"},"key":["tenant"],"algorithm":"fixed_window","limit":50,"window":"1s",
   "exempt":{"cidrs":["10.0.0.0/8"]}}
 ]}`

// TestSeedLoginAndLowcode: /v1/auth/login 10 per 5 min per client IP;
// /v1/lowcode/ 50 per second per tenant, except from 10.0.0.0/8.
func TestSeedLoginAndLowcode(t *testing.T) {
	buildWasm(t)
	e := newEnv(t, `{"env":"prod","tick":"1m","policy":`+seedLoginPolicy+`}`, 2)
	login := func(w int, ip string) host.Response {
		return e.do(w, req{method: "POST", path: "/v1/auth/login", src: ip + ":5555"})
	}
	for i := 0; i < 10; i++ {
		if r := login(i%2, "198.51.100.1"); r.Status != 200 {
			t.Fatalf("login %d: %d", i+1, r.Status)
		}
		e.clock.Advance(10 * time.Second)
	}
	r := login(0, "198.51.100.1")
	if r.Status != 429 {
		t.Fatalf("11th login: %d, want 429", r.Status)
	}
	// 30 slots of 10 s: the first login (t=0) leaves the window at 300 s; now t=100 s.
	wantHeaders(t, r.Headers, map[string]string{"retry-after": "200", "x-ratelimit-limit": "10", "x-ratelimit-remaining": "0"})
	wantState(t, r.FilterState, map[string]string{"sluice.key": "rl:prod:edge/login-per-ip:ip=198.51.100.1:300s", "sluice.policy_version": "7"})
	if r := login(1, "198.51.100.2"); r.Status != 200 {
		t.Errorf("other IP: %d", r.Status)
	}
	if r := e.do(0, req{method: "GET", path: "/v1/auth/login", src: "198.51.100.1:1"}); r.Status != 200 {
		t.Errorf("GET login (rule is POST only): %d", r.Status)
	}
	e.clock.Advance(200 * time.Second)
	if r := login(0, "198.51.100.1"); r.Status != 200 {
		t.Errorf("after Retry-After: %d", r.Status)
	}

	tenant := func(w int, name, ip string) host.Response {
		return e.do(w, req{path: "/v1/lowcode/apps/1", src: ip + ":1", headers: host.Headers{{"x-tenant-id", name}}})
	}
	e.clock.Advance(time.Second - time.Duration(e.clock.Now().Nanosecond())) // start of a second
	for i := 0; i < 50; i++ {
		if r := tenant(i%2, "acme", "198.51.100.9"); r.Status != 200 {
			t.Fatalf("lowcode %d: %d", i+1, r.Status)
		}
	}
	r = tenant(0, "acme", "198.51.100.9")
	if r.Status != 429 {
		t.Fatalf("51st lowcode in the second: %d", r.Status)
	}
	wantHeaders(t, r.Headers, map[string]string{"retry-after": "1", "x-ratelimit-limit": "50", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"})
	for i := 0; i < 100; i++ {
		r := tenant(i%2, "acme", "10.1.2.3")
		if r.Status != 200 {
			t.Fatalf("exempt range, request %d: %d", i, r.Status)
		}
		if i == 0 {
			// Exempt: no rule applies, so no filter state at all.
			if v, ok := r.FilterState[filterstate.Key]; ok {
				t.Errorf("exempt request: filter state %s", v)
			}
			wantHeaders(t, r.Headers, map[string]string{"x-ratelimit-limit": ""})
		}
	}
	if r := tenant(1, "globex", "198.51.100.9"); r.Status != 200 {
		t.Errorf("other tenant: %d", r.Status)
	}
	e.clock.Advance(time.Second)
	if r := tenant(0, "acme", "198.51.100.9"); r.Status != 200 {
		t.Errorf("next second: %d", r.Status)
	}
}

// TestSeedShadow: a shadow rule never rejects, but its would-be denials show
// in filter state and metrics; an enforced rule beside it still limits.
func TestSeedShadow(t *testing.T) {
	buildWasm(t)
	pol := `{"policy":"p","version":2,"rules":[
	  {"id":"trial","key":["client_ip"],"algorithm":"fixed_window","limit":3,"window":"1m","shadow":true}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	for i := 1; i <= 10; i++ {
		r := e.do(0, req{path: "/"})
		if r.Status != 200 || r.LocalReply != nil {
			t.Fatalf("request %d: %d, shadow rules never reject", i, r.Status)
		}
		shadow := "false"
		if i > 3 {
			shadow = "true"
		}
		wantState(t, r.FilterState, map[string]string{
			"sluice.rate_limited": "false", "sluice.shadow": shadow, "sluice.rule": "trial", "sluice.limit": "3",
		})
		// Shadow rules are not advertised to clients.
		wantHeaders(t, r.Headers, map[string]string{"x-ratelimit-limit": ""})
	}
	if got := e.metric("sluice.rule.trial.shadow_limited"); got != 7 {
		t.Errorf("shadow_limited = %d, want 7", got)
	}
	if got := e.metric("sluice.rule.trial.allowed"); got != 3 {
		t.Errorf("allowed = %d, want 3", got)
	}
}
