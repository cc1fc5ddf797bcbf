package main

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// Per-request hostcall budgets of the filter through the real .wasm: every
// hostcall leaves the sandbox and costs far more than the guest code
// around it, so what a request spends is counted by import name
// (host.Host.ImportCalls) and bounded here.
const (
	// budgetAllowedTotal bounds every hostcall (proxy_* and WASI) of an
	// allowed request through one rule, with the default response headers
	// (none on an allowed response): its header read(s), one clock read,
	// one shared-data read and write and one filter-state write.
	budgetAllowedTotal = 6
	// budgetDeniedExtra is what a denied request may make beyond an allowed
	// one's: it skips the shared-data write but reads x-request-id (the
	// reply's trace_id) and sends the local reply, which carries every
	// response header in the one call.
	budgetDeniedExtra = 1
	// budgetClockReads bounds proxy_get_current_time_nanoseconds and WASI
	// clock_time_get together, per request.
	budgetClockReads = 1
	// budgetSetProperty bounds proxy_set_property (filter state) per
	// request.
	budgetSetProperty = 1
	// budgetPerExtraRule is what each further matching rule may add to
	// budgetAllowedTotal: its shared-data read and write.
	budgetPerExtraRule = 2
	// budgetNoMatchReads bounds the reads of a request no rule matches:
	// the :path a path_prefix rule needs.
	budgetNoMatchReads = 1
)

// hostcallRequests is how many requests each case counts, one at a time.
const hostcallRequests = 20

// callCounts is one request's hostcalls by import name.
type callCounts map[string]uint64

func (c callCounts) total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

func (c callCounts) clockReads() uint64 {
	return c["proxy_get_current_time_nanoseconds"] + c["clock_time_get"]
}

func (c callCounts) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(k + "=" + strconv.FormatUint(c[k], 10))
	}
	return "total=" + strconv.FormatUint(c.total(), 10) + " [" + b.String() + "]"
}

// hostcallCase is one configuration and the request whose hostcalls are
// counted.
type hostcallCase struct {
	rules      []string
	user, path string
	status     int
	// warm are the users sent (on the counted path) before counting, so
	// that first-request work (key creation, allocation growth) is behind.
	warm []string
	// responseHeaders is the policy's response_headers object ("": absent).
	responseHeaders string
	// requestID, when not empty, is every request's x-request-id.
	requestID string
	// module and pluginConfig, when module is not nil, replace sluice
	// and the configuration made of rules and responseHeaders.
	module       []byte
	pluginConfig string
	// afterWarm, when set, runs after the warm-up requests (a fleet case
	// seeds its lease there).
	afterWarm func(t testing.TB, h *host.Host)
	// wantState are filter-state members every counted request must have.
	wantState map[string]string
}

// hostcallResult is what measuring a case found: the per-request counts
// most of the requests made (the steady state), and every distinct
// per-request count with how many requests made it.
type hostcallResult struct {
	costliest callCounts // the request with the most calls
	distinct  map[string]int
	// entries is the most entries into the module (Go) one request made:
	// callbacks plus allocator calls; callbacks and allocs split it.
	entries, callbacks, allocs uint64
}

// measureHostcalls starts one worker VM of the filter with the default
// plugin configuration (rate-limit headers "x-ratelimit" on denials only)
// and c's rules and response headers,
// warms it, then sends hostcallRequests full streams (request headers,
// upstream, response headers, on_log/on_done/on_delete) one at a time,
// counting each stream's hostcalls.
//
// The budgets hold for every request: once warm the request path
// allocates nothing (TestWarmRequestPathAllocatesNothing), so the Go
// runtime does not collect, and a collection's clock reads cannot land in
// a counted request. The request with the most calls is the one checked;
// every distinct count seen is logged.
func measureHostcalls(t *testing.T, c hostcallCase) hostcallResult {
	t.Helper()
	module, cfg := c.module, c.pluginConfig
	if module == nil {
		module = buildWasmTB(t)
		cfg = `{"tick":"1m","policy":` + benchPolicyHeaders(c.responseHeaders, c.rules...) + `}`
	}
	h, err := host.New(context.Background(), host.Config{
		Wasm: module, VMID: "sluice", PluginName: "sluice", NoCanary: true,
		PluginConfig: []byte(cfg), Clock: host.NewVirtualClock(epoch), LogLevel: host.LogInfo,
		// A control plane nobody serves (loopback port 1 refuses): its
		// policy poll fails, and the static policy stays in use.
		Clusters: map[string]string{"cp": "127.0.0.1:1"},
	})
	if err != nil {
		t.Fatalf("host.New: %v", err)
	}
	defer func() {
		for _, l := range h.Logs() {
			if l.Level >= host.LogError {
				t.Errorf("guest error log: %.3000s", l.Message)
			}
		}
		h.Close()
	}()
	w := h.Worker(0)
	send := func(user string) host.Response {
		t.Helper()
		headers := host.Headers{{"x-user-id", user}, {"x-tenant-id", "acme"}}
		if c.requestID != "" {
			headers = append(headers, [2]string{"x-request-id", c.requestID})
		}
		resp, err := w.Do(context.Background(), host.Request{Path: c.path, Headers: headers,
			Info: host.StreamInfo{SourceAddress: "203.0.113.7:40000"}})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		return resp
	}
	for range 3 {
		for _, u := range c.warm {
			send(u)
		}
	}
	if c.afterWarm != nil {
		c.afterWarm(t, h)
	}
	res := hostcallResult{distinct: map[string]int{}}
	seen := map[string]callCounts{}
	for i := range hostcallRequests {
		h.ResetImportCalls()
		resp := send(c.user)
		got := callCounts(h.ImportCalls())
		var cb uint64
		for _, n := range h.CallbackCalls() {
			cb += n
		}
		if al := h.AllocatorCalls(); cb+al > res.entries {
			res.entries, res.callbacks, res.allocs = cb+al, cb, al
		}
		if resp.Status != c.status {
			t.Fatalf("request %d: status %d, want %d", i, resp.Status, c.status)
		}
		for k, v := range c.wantState {
			if got := filterstate.Fields(resp.FilterState)[k]; got != v {
				t.Fatalf("request %d: filter state %s = %q, want %q (%s)", i, k, got, v, resp.FilterState)
			}
		}
		k := got.String()
		res.distinct[k]++
		seen[k] = got
	}
	worst := ""
	for k, n := range res.distinct {
		t.Logf("%d of %d requests: %s", n, hostcallRequests, k)
		if worst == "" || seen[k].total() > seen[worst].total() || (seen[k].total() == seen[worst].total() && k < worst) {
			worst = k
		}
	}
	res.costliest = seen[worst]
	t.Logf("costliest request: %s", worst)
	t.Logf("most entries into the module: %d (%d callbacks, %d allocator calls)", res.entries, res.callbacks, res.allocs)
	return res
}

// TestRequestHostCallBudget pins the hostcalls of one request through the
// filter, per import, for an allowed request, a request no rule matches, a
// denied request and an allowed request through five rules (see
// measureHostcalls for which request's counts are checked).
func TestRequestHostCallBudget(t *testing.T) {
	const rule = `{"id":"r0","key":["user"],"algorithm":"token_bucket","limit":1000000000000,"window":"1s"}`
	const path = "/v1/api/items"
	others := []string{"user-0", "user-1", "user-2"}

	var allowedTotal uint64
	t.Run("allowed", func(t *testing.T) {
		r := measureHostcalls(t, hostcallCase{rules: []string{rule}, user: "user-0", path: path, status: 200, warm: others})
		allowedTotal = r.costliest.total()
		if r.costliest.total() > budgetAllowedTotal {
			t.Errorf("hostcalls per request: %d, want ≤ %d", r.costliest.total(), budgetAllowedTotal)
		}
		if n := r.costliest.clockReads(); n > budgetClockReads {
			t.Errorf("clock reads (proxy_get_current_time_nanoseconds + clock_time_get): %d, want ≤ %d", n, budgetClockReads)
		}
		if n := r.costliest["proxy_set_property"]; n > budgetSetProperty {
			t.Errorf("proxy_set_property: %d, want ≤ %d", n, budgetSetProperty)
		}
		if n := r.costliest["proxy_get_shared_data"]; n != 1 {
			t.Errorf("proxy_get_shared_data: %d, want 1", n)
		}
		if n := r.costliest["proxy_set_shared_data"]; n != 1 {
			t.Errorf("proxy_set_shared_data: %d, want 1", n)
		}
	})

	// The shipped configuration pulls the policy from a control plane,
	// which checks for a newly published policy on the request path: that
	// check must take the request's one clock reading, not read its own.
	t.Run("allowed_with_control_plane", func(t *testing.T) {
		cfg := `{"tick":"10s","policy":` + benchPolicy(rule) +
			`,"control_plane":{"cluster":"cp","policy":"bench","wait":"1s","timeout":"2s","lease":"1m","first_policy_wait":"0s"}}`
		r := measureHostcalls(t, hostcallCase{module: buildWasmTB(t), pluginConfig: cfg,
			user: "user-0", path: path, status: 200, warm: others})
		if allowedTotal == 0 {
			t.Fatal("the allowed case did not run (run the whole test)")
		}
		if n := r.costliest.clockReads(); n > budgetClockReads {
			t.Errorf("clock reads (proxy_get_current_time_nanoseconds + clock_time_get): %d, want ≤ %d", n, budgetClockReads)
		}
		// One shared-data read more at most: the published policy's meta,
		// read at most every policysync.RequestCheckInterval.
		if n := r.costliest.total(); n > allowedTotal+1 {
			t.Errorf("hostcalls per request: %d, want ≤ %d (a static policy's %d, and the meta read)", n, allowedTotal+1, allowedTotal)
		}
	})

	t.Run("no_match", func(t *testing.T) {
		noMatch := `{"id":"r0","match":{"path_prefix":"/elsewhere"},"key":["user"],"algorithm":"token_bucket","limit":1,"window":"1h"}`
		r := measureHostcalls(t, hostcallCase{rules: []string{noMatch}, user: "user-0", path: path, status: 200, warm: others})
		var reads uint64
		for k, v := range r.costliest {
			switch k {
			case "proxy_get_header_map_value", "proxy_get_header_map_pairs", "proxy_get_property":
				reads += v
			default:
				t.Errorf("%s: %d calls, want none (only the reads matching needs)", k, v)
			}
		}
		if reads > budgetNoMatchReads {
			t.Errorf("header/property reads: %d, want ≤ %d (the :path)", reads, budgetNoMatchReads)
		}
	})

	t.Run("denied", func(t *testing.T) {
		limit1 := `{"id":"r0","key":["user"],"algorithm":"token_bucket","limit":1,"window":"1h"}`
		r := measureHostcalls(t, hostcallCase{rules: []string{limit1}, user: "user-0", path: path, status: 429, warm: others})
		if allowedTotal == 0 {
			t.Fatal("the allowed case did not run (run the whole test)")
		}
		if r.costliest.total() > allowedTotal+budgetDeniedExtra {
			t.Errorf("hostcalls per denied request: %d, want ≤ %d (an allowed request's + %d)", r.costliest.total(), allowedTotal+budgetDeniedExtra, budgetDeniedExtra)
		}
		if n := r.costliest["proxy_add_header_map_value"]; n != 0 {
			t.Errorf("proxy_add_header_map_value: %d, want 0 (the local reply carries the headers)", n)
		}
		if n := r.costliest["proxy_set_shared_data"]; n != 0 {
			t.Errorf("proxy_set_shared_data: %d, want 0", n)
		}
		if n := r.costliest["proxy_get_shared_data"]; n != 1 {
			t.Errorf("proxy_get_shared_data: %d, want 1", n)
		}
		if n := r.costliest.clockReads(); n > budgetClockReads {
			t.Errorf("clock reads: %d, want ≤ %d", n, budgetClockReads)
		}
		if n := r.costliest["proxy_set_property"]; n > budgetSetProperty {
			t.Errorf("proxy_set_property: %d, want ≤ %d (the trace id goes in the one value)", n, budgetSetProperty)
		}
	})

	t.Run("five_rules", func(t *testing.T) {
		r := measureHostcalls(t, hostcallCase{rules: fiveRules(), user: "user-0", path: path, status: 200, warm: others})
		if want := uint64(budgetAllowedTotal + budgetPerExtraRule*4); r.costliest.total() > want {
			t.Errorf("hostcalls per request: %d, want ≤ %d", r.costliest.total(), want)
		}
		if n := r.costliest["proxy_get_shared_data"]; n > 5 {
			t.Errorf("proxy_get_shared_data: %d, want ≤ 5 (one per rule)", n)
		}
		if n := r.costliest["proxy_set_shared_data"]; n > 5 {
			t.Errorf("proxy_set_shared_data: %d, want ≤ 5 (one per rule)", n)
		}
		if n := r.costliest.clockReads(); n > budgetClockReads {
			t.Errorf("clock reads: %d, want ≤ %d (one per request, not per rule)", n, budgetClockReads)
		}
		if n := r.costliest["proxy_set_property"]; n > budgetSetProperty {
			t.Errorf("proxy_set_property: %d, want ≤ %d", n, budgetSetProperty)
		}
	})

	// A key "user|client_ip" reads the client address (source.address)
	// only for a request without a user: with one, it costs what a key
	// "user" costs.
	userElseIP := `{"id":"r0","key":["user|client_ip"],"algorithm":"token_bucket","limit":1000000000000,"window":"1s"}`
	for _, tc := range []struct {
		name, user     string
		propertyReads  uint64
		beyondUserOnly uint64
	}{
		{"user_else_client_ip_with_user", "user-0", 0, 0},
		{"user_else_client_ip_without_user", "", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := measureHostcalls(t, hostcallCase{rules: []string{userElseIP}, user: tc.user, path: path, status: 200, warm: []string{tc.user}})
			if allowedTotal == 0 {
				t.Fatal("the allowed case did not run (run the whole test)")
			}
			if n := r.costliest["proxy_get_property"]; n != tc.propertyReads {
				t.Errorf("proxy_get_property: %d, want %d", n, tc.propertyReads)
			}
			if n := r.costliest.total(); n != allowedTotal+tc.beyondUserOnly {
				t.Errorf("hostcalls per request: %d, want %d (a key \"user\" costs %d)", n, allowedTotal+tc.beyondUserOnly, allowedTotal)
			}
		})
	}

	// Each response-header set a policy may choose costs an allowed request
	// exactly one proxy_add_header_map_value per header it adds, and nothing
	// more; without on_allow it costs an allowed request nothing.
	for _, tc := range []struct {
		name            string
		responseHeaders string
		adds            uint64
	}{
		{"denials_only", `{"set":"x-ratelimit"}`, 0},
		{"none", `{"set":"none","on_allow":true}`, 0},
		{"ratelimit", `{"set":"ratelimit","on_allow":true}`, 2},
		{"x-ratelimit", `{"set":"x-ratelimit","on_allow":true}`, 3},
		{"both", `{"set":"both","on_allow":true}`, 5},
	} {
		t.Run("allowed_response_headers_"+tc.name, func(t *testing.T) {
			r := measureHostcalls(t, hostcallCase{rules: []string{rule}, user: "user-0", path: path, status: 200, warm: others,
				responseHeaders: tc.responseHeaders})
			if allowedTotal == 0 {
				t.Fatal("the allowed case did not run (run the whole test)")
			}
			if n := r.costliest["proxy_add_header_map_value"]; n != tc.adds {
				t.Errorf("proxy_add_header_map_value: %d, want %d", n, tc.adds)
			}
			if n := r.costliest.total(); n != allowedTotal+tc.adds {
				t.Errorf("hostcalls per request: %d, want %d (the default's %d + %d headers)", n, allowedTotal+tc.adds, allowedTotal, tc.adds)
			}
		})
	}
}

// TestCallFloorMakesSluicesHostCalls keeps the call floor
// (testdata/callfloor) honest: per import, it makes the hostcalls of
// sluice's one-rule request with a path match, allowed and denied (with an
// x-request-id, as Envoy sets one), and of its five-rule request with
// "rules=5", so that measuring it beside sluice prices sluice's logic and
// nothing else.
func TestCallFloorMakesSluicesHostCalls(t *testing.T) {
	callFloor := buildFloor(t, "callfloor")
	const path = "/v1/api/items"
	rule := func(id, limit, window string) string {
		return `{"id":"` + id + `","match":{"path_prefix":"/v1/"},"key":["user"],"algorithm":"token_bucket","limit":` + limit + `,"window":"` + window + `"}`
	}
	var five []string
	for _, id := range []string{"r0", "r1", "r2", "r3", "r4"} {
		five = append(five, rule(id, "1000000000000", "1s"))
	}
	for _, tc := range []struct {
		name        string
		rules       []string
		floorConfig string
		status      int
	}{
		{"allowed", []string{rule("r0", "1000000000000", "1s")}, "", 200},
		{"denied", []string{rule("r0", "1", "1h")}, "deny", 429},
		{"five_rules", five, "rules=5", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostcallCase{rules: tc.rules, user: "user-0", path: path, status: tc.status,
				warm: []string{"user-0", "user-1"}, requestID: "7f1c2b9e-0d3a-4c55-9e1b-0123456789ab"}
			sluice := measureHostcalls(t, c)
			c.module, c.pluginConfig = callFloor, tc.floorConfig
			floor := measureHostcalls(t, c)
			if !maps.Equal(floor.costliest, sluice.costliest) {
				t.Errorf("call floor: %s\nsluice:     %s", floor.costliest, sluice.costliest)
			}
		})
	}
}

// Entries into the module per request: every callback the host enters and
// every allocator call it makes to place a hostcall's result. Each entry
// into Go costs what its wrapper and the binding's dispatch cost, on top
// of what the callback does, so a request's entries are bounded as its
// hostcalls are (docs/benchmarks.md, "A request at a C filter's cost").
const (
	// budgetEntryCallbacks: proxy_on_context_create,
	// proxy_on_request_headers, proxy_on_response_headers and
	// proxy_on_delete (proxy_on_log and proxy_on_done are not exported).
	budgetEntryCallbacks = 4
	// budgetEntriesAllowed: the callbacks and two allocator calls, the
	// x-user-id value and the rule's bucket.
	budgetEntriesAllowed = budgetEntryCallbacks + 2
	// budgetEntriesDenied: an allowed request's, and the x-request-id value
	// the local reply carries as trace_id.
	budgetEntriesDenied = budgetEntriesAllowed + 1
	// budgetEntriesPerExtraRule: each further rule's bucket read.
	budgetEntriesPerExtraRule = 1
	// budgetEntriesFleetWarm: a fleet rule spending from a warm lease reads
	// its lease entry instead of a bucket: as many as an allowed request.
	budgetEntriesFleetWarm = budgetEntriesAllowed
	// budgetHostcallsFleetWarm: an allowed request's hostcalls, the lease
	// read and compare-and-swap write in place of the bucket's.
	budgetHostcallsFleetWarm = budgetAllowedTotal
)

// TestRequestGoEntryBudget pins the entries into the module (callbacks and
// allocator calls) of one request, for an allowed request, a denied one,
// one through five rules, and one spending a fleet rule's warm lease; the
// fleet case's hostcalls too (the others' are TestRequestHostCallBudget's).
func TestRequestGoEntryBudget(t *testing.T) {
	const rule = `{"id":"r0","key":["user"],"algorithm":"token_bucket","limit":1000000000000,"window":"1s"}`
	const path = "/v1/api/items"
	others := []string{"user-0", "user-1", "user-2"}
	check := func(t *testing.T, r hostcallResult, want uint64) {
		t.Helper()
		if r.entries > want {
			t.Errorf("entries into the module per request: %d (%d callbacks, %d allocator calls), want ≤ %d",
				r.entries, r.callbacks, r.allocs, want)
		}
		if r.callbacks > budgetEntryCallbacks {
			t.Errorf("callbacks per request: %d, want ≤ %d", r.callbacks, budgetEntryCallbacks)
		}
	}
	t.Run("allowed", func(t *testing.T) {
		check(t, measureHostcalls(t, hostcallCase{rules: []string{rule}, user: "user-0", path: path, status: 200, warm: others}),
			budgetEntriesAllowed)
	})
	t.Run("denied", func(t *testing.T) {
		limit1 := `{"id":"r0","key":["user"],"algorithm":"token_bucket","limit":1,"window":"1h"}`
		check(t, measureHostcalls(t, hostcallCase{rules: []string{limit1}, user: "user-0", path: path, status: 429, warm: others,
			requestID: "9b2a6c1e-4f1d-4e53-9d7c-2a1f0c3b5e77"}), budgetEntriesDenied)
	})
	t.Run("five_rules", func(t *testing.T) {
		check(t, measureHostcalls(t, hostcallCase{rules: fiveRules(), user: "user-0", path: path, status: 200, warm: others}),
			budgetEntriesAllowed+4*budgetEntriesPerExtraRule)
	})
	t.Run("fleet_warm_lease", func(t *testing.T) {
		doc := benchPolicy(fleetBenchRule + `,"scope":"fleet"}`)
		r := measureHostcalls(t, hostcallCase{module: buildWasmTB(t), pluginConfig: `{"tick":"1m","policy":` + doc + `}`,
			user: "hot", path: path, status: 200, warm: []string{"hot"},
			afterWarm: func(t testing.TB, h *host.Host) { seedLease(t, h, doc, "hot") },
			wantState: map[string]string{"quota": "local"}})
		check(t, r, budgetEntriesFleetWarm)
		if n := r.costliest.total(); n > budgetHostcallsFleetWarm {
			t.Errorf("hostcalls per request: %d, want ≤ %d", n, budgetHostcallsFleetWarm)
		}
		if n := r.costliest["proxy_http_call"]; n != 0 {
			t.Errorf("proxy_http_call: %d, want 0 (a warm lease spends without asking)", n)
		}
	})
}
