package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestAlgorithmsEndToEnd drives each algorithm through the filter on a
// virtual clock and checks every response against the same algorithm run
// natively (package limit) on the same times: status, Retry-After,
// X-RateLimit-* and the JSON body, exactly.
func TestAlgorithmsEndToEnd(t *testing.T) {
	buildWasm(t)
	cases := []struct {
		name string
		rule string
		step time.Duration
		n    int
	}{
		{"token_bucket", `"algorithm":"token_bucket","limit":5,"window":"10s","burst":3`, 700 * time.Millisecond, 40},
		{"time_wheel", `"algorithm":"time_wheel","limit":5,"window":"15s","slots":5`, 900 * time.Millisecond, 50},
		{"fixed_window", `"algorithm":"fixed_window","limit":4,"window":"10s"`, 800 * time.Millisecond, 40},
		{"gcra", `"algorithm":"gcra","limit":2,"window":"1s","burst":2`, 150 * time.Millisecond, 40},
		{"sliding_log", `"algorithm":"sliding_log","limit":3,"window":"5s"`, 600 * time.Millisecond, 40},
		{"calendar_day", `"algorithm":"fixed_window","limit":3,"align":"calendar_day","timezone":"Europe/Berlin"`, 3 * time.Hour, 30},
	}
	// One policy, one rule per algorithm, each on its own path prefix, so
	// one host serves every case (time only moves forward).
	policy := `{"policy":"p","version":3,"rules":[`
	for i, tc := range cases {
		if i > 0 {
			policy += ","
		}
		policy += `{"id":"` + tc.name + `","match":{"path_prefix":"/` + tc.name + `/"},"key":["client_ip"],` + tc.rule + `}`
	}
	policy += `]}`
	e := newEnv(t, `{"env":"test","tick":"1m","policy":`+policy+`,"headers":"both","headers_on_allow":true}`, 1)
	pol, err := rules.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	comp, err := rules.Compile(pol, rules.CompileOptions{Env: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for ri, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cr := comp.Rule(ri)
			lim := cr.Limiter
			state := make([]byte, lim.StateSize())
			next := make([]byte, lim.StateSize())
			allowed, denied := 0, 0
			for i := 0; i < tc.n; i++ {
				now := e.clock.Now().UnixNano()
				d := lim.Decide(state, next, now, 1)
				if d.Allowed {
					copy(state, next)
				}
				resp := e.do(0, req{path: "/" + tc.name + "/x?q=1", headers: host.Headers{{"x-request-id", "req-" + strconv.Itoa(i)}}})
				checkDecision(t, i, resp, cr, d, e.clock.Now())
				if d.Allowed {
					allowed++
				} else {
					denied++
				}
				e.clock.Advance(tc.step)
			}
			if allowed == 0 || denied == 0 {
				t.Fatalf("scenario too weak: %d allowed, %d denied", allowed, denied)
			}
			if got := e.metric("sluice.rule." + tc.name + ".allowed"); got != int64(allowed) {
				t.Errorf("metric allowed = %d, want %d", got, allowed)
			}
			if got := e.metric("sluice.rule." + tc.name + ".limited"); got != int64(denied) {
				t.Errorf("metric limited = %d, want %d", got, denied)
			}
		})
	}
	if got := e.metric("sluice.policy_version"); got != 3 {
		t.Errorf("metric policy_version = %d, want 3", got)
	}
}

// checkDecision compares one response of the filter with the native
// decision d of rule cr.
func checkDecision(t *testing.T, i int, resp host.Response, cr *rules.CompiledRule, d limit.Decision, now time.Time) {
	t.Helper()
	reset := ceil(d.Reset)
	period := strconv.FormatUint(cr.PeriodSeconds, 10) // the counter key's
	window := period
	if a := cr.Config.Algorithm; a == limit.TokenBucket || a == limit.GCRA {
		// A bucket's policy window is the time to refill its capacity (d.Limit),
		// in whole seconds rounded up.
		ns := (d.Limit*uint64(cr.Config.Window) + cr.Config.Limit - 1) / cr.Config.Limit
		window = strconv.FormatUint(max((ns+uint64(time.Second)-1)/uint64(time.Second), 1), 10)
	}
	want := map[string]string{
		"x-ratelimit-limit":     strconv.FormatUint(d.Limit, 10),
		"x-ratelimit-remaining": strconv.FormatUint(d.Remaining, 10),
		"x-ratelimit-reset":     strconv.FormatUint(reset, 10),
		"ratelimit-policy":      `"` + cr.ID + `";q=` + strconv.FormatUint(d.Limit, 10) + ";w=" + window,
		"ratelimit":             `"` + cr.ID + `";r=` + strconv.FormatUint(d.Remaining, 10) + ";t=" + strconv.FormatUint(reset, 10),
	}
	state := map[string]string{
		"sluice.rule": cr.ID, "sluice.limit": want["x-ratelimit-limit"],
		"sluice.remaining": want["x-ratelimit-remaining"], "sluice.reset": want["x-ratelimit-reset"],
		"sluice.shadow": "false", "sluice.policy_version": "3", "sluice.reason": "",
		"sluice.key": "rl:test:p/" + cr.ID + ":ip=203.0.113.7:" + period + "s",
	}
	if d.Allowed {
		if resp.Status != 200 || resp.LocalReply != nil {
			t.Fatalf("request %d: status %d, want 200 (native decision %+v)", i, resp.Status, d)
		}
		want["retry-after"] = ""
		state["sluice.rate_limited"] = "false"
		state["sluice.trace_id"] = "" // written only with a local reply
		wantHeaders(t, resp.Headers, want)
		wantState(t, resp.FilterState, state)
		return
	}
	if resp.Status != 429 {
		t.Fatalf("request %d: status %d, want 429 (native decision %+v)", i, resp.Status, d)
	}
	ra := ceil(d.RetryAfter)
	if d.RetryAfter == limit.Never {
		ra = reset
	}
	want["retry-after"] = strconv.FormatUint(max(ra, 1), 10)
	want["content-type"] = "application/json"
	wantHeaders(t, resp.Headers, want)
	state["sluice.rate_limited"] = "true"
	state["sluice.trace_id"] = "req-" + strconv.Itoa(i) // the body's trace_id, for the access log
	wantState(t, resp.FilterState, state)
	b := decodeReply(t, resp)
	if b.Code != 429 || b.Message != "rate limit exceeded" || b.Data.Rule != cr.ID ||
		b.Data.Limit != d.Limit || b.Data.Remaining != d.Remaining || b.Data.Reset != reset ||
		b.TraceID != "req-"+strconv.Itoa(i) {
		t.Errorf("request %d: body %+v, native decision %+v", i, b, d)
	}
	if want := now.UTC().Format(time.RFC3339); b.Timestamp != want {
		t.Errorf("request %d: timestamp %q, want %q (the virtual clock)", i, b.Timestamp, want)
	}
}

func ceil(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Second - 1) / time.Second)
}

// TestALocalReplyCarriesOneTraceIDInItsBodyAndItsFilterState: a denied
// request's trace id, whatever bytes its x-request-id holds, reads back the
// same from the 429's body and from the filter state (one escape serves
// both); without an id the body says "" and the filter state has none.
func TestALocalReplyCarriesOneTraceIDInItsBodyAndItsFilterState(t *testing.T) {
	pol := `{"policy":"p","version":1,"rules":[{"id":"r","match":{"path_prefix":"/"},"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","policy":`+pol+`}`, 1)
	if resp := e.do(0, req{path: "/x"}); resp.Status != 200 {
		t.Fatalf("first request: status %d", resp.Status)
	}
	for _, id := range []string{`say "hi" \ bye`, "tab\there", "é\u2028x", "plain-0123456789abcdef", ""} {
		// An empty x-request-id, which the host keeps (it adds one, as
		// Envoy does, only to a request without the header), is no id.
		resp := e.do(0, req{path: "/x", headers: host.Headers{{"x-request-id", id}}})
		if resp.Status != 429 {
			t.Fatalf("id %q: status %d, want 429", id, resp.Status)
		}
		if b := decodeReply(t, resp); b.TraceID != id {
			t.Errorf("id %q: the body's trace_id is %q", id, b.TraceID)
		}
		wantState(t, resp.FilterState, map[string]string{"sluice.trace_id": id, "sluice.rate_limited": "true"})
	}
}

// TestDenialsOfTwoRulesWithTheSameNumbersEachNameTheirOwnRule: two rules of
// the same limit, denied in turn at one instant, give replies of the same
// numbers; each reply's headers still name its own rule (a reply's headers
// are kept for the next one only when both its numbers and its rule match).
func TestDenialsOfTwoRulesWithTheSameNumbersEachNameTheirOwnRule(t *testing.T) {
	pol := `{"policy":"p","version":1,"rules":[` +
		`{"id":"ra","match":{"path_prefix":"/a/"},"algorithm":"fixed_window","limit":1,"window":"1h"},` +
		`{"id":"rb","match":{"path_prefix":"/b/"},"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	e := newEnv(t, `{"tick":"1m","headers":"both","policy":`+pol+`}`, 1)
	for _, path := range []string{"/a/x", "/b/x"} {
		if resp := e.do(0, req{path: path}); resp.Status != 200 {
			t.Fatalf("%s: first request: status %d", path, resp.Status)
		}
	}
	for i, rule := range []string{"ra", "ra", "rb", "ra", "rb", "rb"} {
		resp := e.do(0, req{path: "/" + rule[1:] + "/x"})
		if resp.Status != 429 {
			t.Fatalf("denial %d (%s): status %d", i, rule, resp.Status)
		}
		wantHeaders(t, resp.Headers, map[string]string{
			"ratelimit-policy": `"` + rule + `";q=1;w=3600`, "x-ratelimit-limit": "1", "x-ratelimit-remaining": "0",
			"content-type": "application/json"})
		if got, _ := resp.Headers.Lookup("ratelimit"); !strings.HasPrefix(got, `"`+rule+`";r=0;t=`) {
			t.Errorf("denial %d (%s): RateLimit %q", i, rule, got)
		}
		if b := decodeReply(t, resp); b.Data.Rule != rule {
			t.Errorf("denial %d (%s): the body names rule %q", i, rule, b.Data.Rule)
		}
	}
}
