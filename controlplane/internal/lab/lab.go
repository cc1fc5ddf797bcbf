// Package lab runs a policy through the real filter module before it ships:
// the .wasm that Envoy loads, under the testenv wazero host, on a virtual
// clock, with an in-process quota service for fleet rules. sluicectl test
// (test files of requests and expected answers) and sluicectl replay (an
// Envoy access log against a candidate policy) are built on it; docs/lab.md
// describes both.
//
// A Fleet is one or more simulated Envoys, each with its own worker VMs and
// shared data (so a rule with "scope": "envoy" counts per Envoy), all
// leasing fleet rules from one quota service (so a rule with "scope":
// "fleet" holds its limit across them, as one budget). Requests run one at
// a time and every HTTP call the filter makes is answered before the next
// request or clock step, so a run depends on its inputs alone.
package lab

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/rls"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/shared/strictjson"
	"github.com/sluice-proxy/sluice/testenv/host"
)

// Config configures NewFleet.
type Config struct {
	// Wasm is the filter module (Module gives the one sluicectl carries).
	// Required.
	Wasm []byte
	// Policy is the policy to enforce, validated (rules.ParsePolicy). Its
	// version is set to 1 when it has none. Required.
	Policy *rules.Policy
	// Envoys is the number of simulated Envoys (default 1).
	Envoys int
	// Workers is each Envoy's worker VMs, Envoy's --concurrency (default 1).
	Workers int
	// Start is the virtual time the fleet starts at (default 2026-01-01
	// 00:00:00 UTC).
	Start time.Time
	// Env is the environment name in counter keys (the filter's "env";
	// default "default").
	Env string
	// Seed seeds what the module draws at random (its hash key among
	// others), so two runs of one input give one output (default 1).
	Seed uint64
}

// Request is one request sent through the fleet.
type Request struct {
	// Method is the request method ("" means GET).
	Method string
	// Path is the request target, ":path" (query string allowed).
	Path string
	// Headers are the other request headers, names in any case.
	Headers [][2]string
	// ClientIP is Envoy's downstream remote address without the port, the
	// address the filter keys client_ip on ("" means 127.0.0.1).
	ClientIP string
	// Envoy is the index of the Envoy that receives the request, 0 ..
	// Envoys-1. Each Envoy deals its requests to its workers in turn.
	Envoy int
}

// Decision is what the filter did with a request.
type Decision struct {
	// Status is the response status: the filter's local reply (429, 503 …),
	// else 200 from the lab's upstream.
	Status int
	// Headers are the response headers (names lower case).
	Headers host.Headers
	// RateLimit is the filter state wasm.sluice as the access log's
	// rate_limit shows it; nil when no rule applied to the request.
	RateLimit *RateLimit
	// RawRateLimit is that filter state's text ("" when absent).
	RawRateLimit string
}

// RateLimit is the filter's decision record (docs/filter.md, "access-log
// metadata"); counts are in cost units, Reset in whole seconds.
type RateLimit struct {
	// RateLimited is true when the filter denied the request; Shadow when a
	// shadow rule would have.
	RateLimited bool `json:"rate_limited"`
	Shadow      bool `json:"shadow"`
	// PolicyVersion is the version of the policy that decided.
	PolicyVersion uint64 `json:"policy_version,omitempty"`
	// Rule and Key name the rule the record reports and its counter key
	// (rl:{env}:{policy}/{rule}:{identifier}:{period}s).
	Rule string `json:"rule,omitempty"`
	Key  string `json:"key,omitempty"`
	// Limit and Remaining are that rule's limit and what is left, in cost
	// units; Reset is the seconds until the limit is whole again.
	Limit     uint64 `json:"limit"`
	Remaining uint64 `json:"remaining"`
	Reset     int64  `json:"reset"`
	// Scope is "fleet" for a fleet rule; Quota how its units were had
	// (local, waited, degraded); Reason why the filter could not decide.
	Scope  string `json:"scope,omitempty"`
	Quota  string `json:"quota,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// decodeRateLimit reads the filter state with the strict decoder the
// filter's own documents use (it is on every request's path, where
// encoding/json's reflection cost a third of the lab's own work); members it
// does not know are skipped, so a newer filter's record still decodes.
func decodeRateLimit(raw []byte) (*RateLimit, error) {
	rl := &RateLimit{}
	d := strictjson.NewDecoder(raw, strictjson.Limits{})
	err := d.Object(func(key string) error {
		var err error
		switch key {
		case "rate_limited":
			rl.RateLimited, err = d.Bool()
		case "shadow":
			rl.Shadow, err = d.Bool()
		case "policy_version":
			rl.PolicyVersion, err = d.Uint64()
		case "rule":
			rl.Rule, err = d.String()
		case "key":
			rl.Key, err = d.String()
		case "limit":
			rl.Limit, err = d.Uint64()
		case "remaining":
			rl.Remaining, err = d.Uint64()
		case "reset":
			rl.Reset, err = d.Int64()
		case "scope":
			rl.Scope, err = d.String()
		case "quota":
			rl.Quota, err = d.String()
		case "reason":
			rl.Reason, err = d.String()
		default:
			err = d.Skip()
		}
		return err
	})
	if err == nil {
		err = d.End()
	}
	if err == nil {
		err = d.Err()
	}
	if err != nil {
		return nil, err
	}
	return rl, nil
}

// Fleet is a set of simulated Envoys running the filter on one virtual
// clock. It is not safe for concurrent use.
type Fleet struct {
	clock    *host.VirtualClock
	envoys   []*host.Host
	next     []int // per Envoy: the worker of its next request
	fleet    bool  // the policy has fleet rules
	policy   *rules.Policy
	compiled *rules.Compiled
	ctx      context.Context
	seq      uint64 // requests sent, for x-request-id
	tick     time.Duration
	rls      *rls.Server // the rate limit service of the descriptor rules; nil without
}

// DefaultStart is the virtual time a Fleet starts at unless Config.Start says.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// quotaCluster is the Envoy cluster name the lab's filters reach the
// in-process quota service by.
const quotaCluster = "sluice_lab_control_plane"

// NewFleet starts cfg.Envoys simulated Envoys of cfg.Workers worker VMs each.
// Errors: a missing module or policy, a module that does not start, a policy
// the filter refuses (its error log names the field).
func NewFleet(ctx context.Context, cfg Config) (*Fleet, error) {
	if len(cfg.Wasm) == 0 {
		return nil, errors.New("lab: no filter module")
	}
	if cfg.Policy == nil {
		return nil, errors.New("lab: no policy")
	}
	cfg.Envoys = max(cfg.Envoys, 1)
	cfg.Workers = max(cfg.Workers, 1)
	if cfg.Start.IsZero() {
		cfg.Start = DefaultStart
	}
	if cfg.Env == "" {
		cfg.Env = "default"
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	p := *cfg.Policy
	if p.Version == 0 {
		p.Version = 1
	}
	doc := rules.EncodePolicy(&p)
	compiled, err := rules.Compile(&p, rules.CompileOptions{Env: cfg.Env})
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	f := &Fleet{clock: host.NewVirtualClock(cfg.Start), next: make([]int, cfg.Envoys),
		policy: &p, compiled: compiled, ctx: ctx}
	for i := range compiled.Len() {
		if compiled.Rule(i).Rule.Scope == rules.ScopeFleet {
			f.fleet = true
		}
	}
	// The tick flushes metrics and, for fleet rules, reports to the quota
	// service every quota_interval (1 s): without fleet rules a minute's tick
	// changes no decision and costs the virtual clock 60 times fewer calls.
	f.tick = time.Minute
	if f.fleet {
		f.tick = time.Second
	}
	pluginCfg := map[string]any{"env": cfg.Env, "policy": json.RawMessage(doc), "tick": f.tick.String()}
	var client *http.Client
	if f.fleet {
		svc := quota.New(quota.Options{
			Backend:  quota.NewMemory(),
			Policies: staticPolicy{store.Record{Name: p.Name, Version: p.Version, Doc: doc}},
			Open:     true,
			Now:      func() int64 { return f.clock.Now().UnixNano() },
			Logger:   slog.New(slog.DiscardHandler),
		})
		client = &http.Client{Transport: inProcess{svc}}
		for i := range p.Rules {
			if p.Rules[i].Descriptor != nil {
				f.rls = rls.New(rls.Options{Quota: svc, Policies: staticPolicy{store.Record{Name: p.Name, Version: p.Version, Doc: doc}},
					Env: cfg.Env, Replica: "lab", InlineRefills: true, Now: func() int64 { return f.clock.Now().UnixNano() },
					Logger: slog.New(slog.DiscardHandler)})
				break
			}
		}
	}
	for e := range cfg.Envoys {
		if f.fleet {
			pluginCfg["control_plane"] = map[string]any{"cluster": quotaCluster, "policy": p.Name,
				"envoy": "lab-envoy-" + strconv.Itoa(e)}
		}
		raw, err := json.Marshal(pluginCfg)
		if err != nil {
			return nil, err
		}
		h, err := host.New(ctx, host.Config{
			Wasm: cfg.Wasm, VMID: "sluice", PluginName: "sluice", NodeID: "lab-envoy-" + strconv.Itoa(e),
			PluginConfig: raw, Workers: cfg.Workers, Clock: f.clock, NoCanary: true,
			LogLevel: host.LogWarn, Clusters: map[string]string{quotaCluster: "lab.invalid:80"},
			HTTPClient: client, Rand: seeded(cfg.Seed, e), InlineCallouts: true,
		})
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lab: starting the filter: %w", err)
		}
		f.envoys = append(f.envoys, h)
	}
	return f, f.settle()
}

// Policy returns the policy the fleet enforces (its version set).
func (f *Fleet) Policy() *rules.Policy { return f.policy }

// Compiled returns the fleet's policy compiled as the filter compiles it,
// for matching and keys outside the filter (rules.Compiled.Match).
func (f *Fleet) Compiled() *rules.Compiled { return f.compiled }

// Envoys returns the number of simulated Envoys.
func (f *Fleet) Envoys() int { return len(f.envoys) }

// HasFleetRules reports whether the policy has a rule with "scope": "fleet".
func (f *Fleet) HasFleetRules() bool { return f.fleet }

// Now returns the fleet's virtual time.
func (f *Fleet) Now() time.Time { return f.clock.Now() }

// idleTicks is how long AdvanceTo lets every tick of an idle stretch run
// before it skips the rest of it.
const idleTicks = time.Minute

// AdvanceTo moves the virtual clock to t (nothing when t is not after Now),
// and every call the filters make on the way is answered. Every tick due
// in the first minute runs (reports, returns of idle leases, metrics); the
// rest of a longer stretch without requests is skipped as if the process
// had been stopped, each tick firing once at t, since ticks without
// requests change no decision. A day without requests costs a minute's
// ticks, not 86,400.
func (f *Fleet) AdvanceTo(t time.Time) error {
	d := t.Sub(f.clock.Now())
	if d <= 0 {
		return nil
	}
	if d > idleTicks+f.tick {
		f.clock.Advance(idleTicks)
		if err := f.settle(); err != nil {
			return err
		}
		f.clock.Skip(d - idleTicks)
	} else {
		f.clock.Advance(d)
	}
	return f.settle()
}

// settle waits until every HTTP call the filters made has been answered.
func (f *Fleet) settle() error {
	if !f.fleet {
		return nil
	}
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	for _, h := range f.envoys {
		if err := h.WaitCallouts(ctx); err != nil {
			return fmt.Errorf("lab: the filter's quota calls did not finish: %w", err)
		}
	}
	return nil
}

// Descriptor is one rate limit descriptor sent to the control plane's rate
// limit service, as Envoy's ratelimit filter sends it.
type Descriptor struct {
	// Domain is the request's domain; Entries the descriptor's (key, value)
	// entries in order.
	Domain  string
	Entries [][2]string
	// Hits is the descriptor's hits_addend (0 means 1).
	Hits uint64
}

// DoDescriptor asks the rate limit service about d at the current virtual time
// and returns its answer as Envoy's ratelimit filter turns it into a response:
// 429 for OVER_LIMIT, else 200 (from the lab's upstream), with the draft-03
// headers Envoy 1.40 writes for one descriptor (docs/rls.md). RateLimit names
// the rule, its limit, what is left and the reset; nil when no rule names d.
// Errors: a policy without descriptor rules, a call the service refuses.
func (f *Fleet) DoDescriptor(d Descriptor) (Decision, error) {
	if f.rls == nil {
		return Decision{}, errors.New("lab: the policy has no descriptor rule")
	}
	desc := &commonrl.RateLimitDescriptor{}
	for _, kv := range d.Entries {
		desc.Entries = append(desc.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[0], Value: kv[1]})
	}
	if d.Hits > 0 {
		desc.HitsAddend = wrapperspb.UInt64(d.Hits)
	}
	resp, err := f.rls.ShouldRateLimit(f.ctx, &rlsv3.RateLimitRequest{Domain: d.Domain, Descriptors: []*commonrl.RateLimitDescriptor{desc}})
	if err != nil {
		return Decision{}, fmt.Errorf("lab: %w", err)
	}
	st := resp.Statuses[0]
	dec := Decision{Status: http.StatusOK}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		dec.Status = http.StatusTooManyRequests
	}
	if cl := st.GetCurrentLimit(); cl != nil {
		rl := &RateLimit{RateLimited: dec.Status != http.StatusOK, Rule: cl.GetName(), Limit: uint64(cl.GetRequestsPerUnit()),
			Remaining: uint64(st.GetLimitRemaining()), Reset: st.GetDurationUntilReset().GetSeconds(), Scope: rules.ScopeFleet}
		dec.RateLimit = rl
		raw, _ := json.Marshal(rl)
		dec.RawRateLimit = string(raw)
		// As Envoy's ratelimit filter writes the draft-03 quota policy
		// (ratelimit_headers.cc): a window only for a known unit, and with it
		// the name only when the limit has one.
		limit := strconv.FormatUint(rl.Limit, 10)
		policy := ""
		if w := unitSeconds[cl.GetUnit()]; w > 0 {
			policy = ", " + limit + ";w=" + strconv.Itoa(w)
			if rl.Rule != "" {
				policy += `;name="` + rl.Rule + `"`
			}
		}
		dec.Headers = host.Headers{
			{"x-ratelimit-limit", limit + policy},
			{"x-ratelimit-remaining", strconv.FormatUint(rl.Remaining, 10)},
			{"x-ratelimit-reset", strconv.FormatInt(rl.Reset, 10)},
		}
	}
	return dec, nil
}

// unitSeconds are the RateLimitService's units in seconds, as Envoy writes
// them in the draft-03 headers' w parameter.
var unitSeconds = map[rlsv3.RateLimitResponse_RateLimit_Unit]int{
	rlsv3.RateLimitResponse_RateLimit_SECOND: 1, rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
	rlsv3.RateLimitResponse_RateLimit_HOUR: 3600, rlsv3.RateLimitResponse_RateLimit_DAY: 86400,
	rlsv3.RateLimitResponse_RateLimit_WEEK: 604800, rlsv3.RateLimitResponse_RateLimit_MONTH: 2592000,
	rlsv3.RateLimitResponse_RateLimit_YEAR: 31536000,
}

// Do sends r through the filter of Envoy r.Envoy at the current virtual time
// and returns what the filter did. Errors: an Envoy index out of range, a
// client IP that is not an address, a VM that failed (the filter trapped).
func (f *Fleet) Do(r Request) (Decision, error) {
	hr, w, err := f.request(r)
	if err != nil {
		return Decision{}, err
	}
	resp, err := w.Do(f.ctx, hr)
	if err != nil {
		return Decision{}, fmt.Errorf("lab: the filter failed: %w", err)
	}
	if err := f.settle(); err != nil {
		return Decision{}, err
	}
	return decision(resp)
}

// CanBatch reports whether DoAt may run requests in batches: one Envoy of
// one worker, and no fleet rules (whose calls are answered between
// requests).
func (f *Fleet) CanBatch() bool {
	return len(f.envoys) == 1 && f.envoys[0].Workers() == 1 && !f.fleet
}

// DoAt sends rs in order, request i at virtual time at[i] (times never going
// back), and returns what the filter did with each: what Do after AdvanceTo
// would, but with as many requests as fit before the filter's next tick in
// one visit to the VM (CanBatch must hold). Errors: as Do's.
func (f *Fleet) DoAt(rs []Request, at []time.Time) ([]Decision, error) {
	if !f.CanBatch() {
		return nil, errors.New("lab: DoAt needs one Envoy of one worker and no fleet rules")
	}
	out := make([]Decision, 0, len(rs))
	hrs := make([]host.Request, len(rs))
	for i, r := range rs {
		hr, _, err := f.request(r)
		if err != nil {
			return nil, err
		}
		hrs[i] = hr
	}
	w := f.envoys[0].Worker(0)
	for n := 0; n < len(rs); {
		// Ticks due by the first request run first; the rest of the batch
		// goes up to the next tick.
		if err := f.AdvanceTo(at[n]); err != nil {
			return nil, err
		}
		end := len(rs)
		if next, ok := f.clock.Next(); ok {
			end = n + 1
			for end < len(rs) && at[end].Before(next) {
				end++
			}
		}
		part := at[n:end]
		resps, err := w.DoBatch(f.ctx, hrs[n:end], func(i int) {
			if d := part[i].Sub(f.clock.Now()); d > 0 {
				f.clock.Advance(d)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("lab: the filter failed: %w", err)
		}
		for _, resp := range resps {
			d, err := decision(resp)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		n = end
	}
	return out, nil
}

// request makes r a host request and picks the worker that receives it.
func (f *Fleet) request(r Request) (host.Request, *host.Worker, error) {
	if r.Envoy < 0 || r.Envoy >= len(f.envoys) {
		return host.Request{}, nil, fmt.Errorf("lab: envoy %d out of range 0..%d", r.Envoy, len(f.envoys)-1)
	}
	src := "127.0.0.1:50000"
	if r.ClientIP != "" {
		a, err := netip.ParseAddr(r.ClientIP)
		if err != nil {
			return host.Request{}, nil, fmt.Errorf("lab: client_ip %q: not an IP address", r.ClientIP)
		}
		src = net.JoinHostPort(a.String(), "50000")
	}
	h := f.envoys[r.Envoy]
	wi := f.next[r.Envoy]
	f.next[r.Envoy] = (wi + 1) % h.Workers()
	hdrs := make(host.Headers, 0, len(r.Headers)+1)
	for _, kv := range r.Headers {
		hdrs = append(hdrs, [2]string{strings.ToLower(kv[0]), kv[1]})
	}
	// Envoy generates an x-request-id when a request has none; the lab numbers
	// its requests instead, so a run's decisions (their trace_id) repeat.
	f.seq++
	if _, ok := hdrs.Lookup("x-request-id"); !ok {
		hdrs = append(hdrs, [2]string{"x-request-id", "lab-" + strconv.FormatUint(f.seq, 10)})
	}
	return host.Request{Method: r.Method, Path: r.Path, Headers: hdrs, Info: host.StreamInfo{SourceAddress: src}}, h.Worker(wi), nil
}

// decision reads what the filter did from a response.
func decision(resp host.Response) (Decision, error) {
	d := Decision{Status: resp.Status, Headers: resp.Headers}
	if raw, ok := resp.FilterState["wasm.sluice"]; ok {
		d.RawRateLimit = raw
		rl, err := decodeRateLimit([]byte(raw))
		if err != nil {
			return d, fmt.Errorf("lab: the filter's state %q does not decode: %w", raw, err)
		}
		d.RateLimit = rl
	}
	return d, nil
}

// FlushMetrics moves the virtual clock on by one tick of the filter, which
// sends its metrics to the host (Metric then reads them).
func (f *Fleet) FlushMetrics() error { return f.AdvanceTo(f.Now().Add(f.tick)) }

// Metric returns the sum over every Envoy of the filter metric name
// (docs/filter.md, "Metrics"), as of the filter's last tick (FlushMetrics).
func (f *Fleet) Metric(name string) uint64 {
	var n uint64
	for _, h := range f.envoys {
		if m, ok := h.Metric(name); ok {
			n += uint64(m.Value)
		}
	}
	return n
}

// Close stops every Envoy. Safe to call more than once.
func (f *Fleet) Close() {
	for _, h := range f.envoys {
		h.Close()
	}
	f.envoys = nil
}

// seeded is the random source of Envoy e of a fleet seeded with seed.
func seeded(seed uint64, e int) io.Reader {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	binary.LittleEndian.PutUint64(s[8:], uint64(e))
	return rand.NewChaCha8(s)
}

// staticPolicy is the quota service's view of the one policy the lab runs.
type staticPolicy struct{ rec store.Record }

func (s staticPolicy) Get(name string) (store.Record, bool) {
	if name != s.rec.Name {
		return store.Record{}, false
	}
	return s.rec, true
}

// List and Generation are the rate limit service's view of it.
func (s staticPolicy) List() []store.Record { return []store.Record{s.rec} }
func (s staticPolicy) Generation() uint64   { return 1 }

// inProcess answers the filter's calls without a network: /v1/quota by the
// quota service, a policy poll with 304 (the static policy stays), anything
// else 404.
type inProcess struct{ quota http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	switch {
	case req.URL.Path == "/v1/quota":
		t.quota.ServeHTTP(rec, req)
	case strings.HasPrefix(req.URL.Path, "/v1/policies/"):
		rec.WriteHeader(http.StatusNotModified)
	default:
		rec.WriteHeader(http.StatusNotFound)
	}
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	res := rec.Result()
	res.Request = req
	if res.Body == nil {
		res.Body = io.NopCloser(bytes.NewReader(nil))
	}
	return res, nil
}
