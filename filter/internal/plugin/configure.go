package plugin

import (
	"errors"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/filter/internal/fleetclient"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/shared/strictjson"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// policyState is a compiled policy with what the request path derives from
// it once: per-rule bucket layouts and shared-data keys, and the request
// headers matching and key building need.
type policyState struct {
	compiled *rules.Compiled
	// version is the policy version (filter state policy_version).
	version uint64
	rules   []ruleState
	// match is what the request path reads before matching (match
	// conditions and exemptions need it), key what it reads after a rule
	// matched (key parts and cost headers), without what match read: a
	// request no rule applies to costs only the match reads.
	match, key reads
	// allHeaders is set when the policy names so many headers that one
	// proxy_get_header_map_pairs before matching is cheaper than reading
	// them one at a time (then key reads no header).
	allHeaders bool
	// userHeader and tenantHeader are the policy's identity headers.
	userHeader, tenantHeader string
	// fleetPol is the policy as the quota client sees it (made on first use).
	fleetPol *fleetclient.Policy
}

// reads is what one phase of the request path reads: header values by
// name, the user and tenant identity headers, :method and :path. Each
// costs a hostcall per request when set. The client address is not among
// them: rules.Request asks for it (clientIP) only when an exemption or a
// key part needs it.
type reads struct {
	headerNames                []string
	user, tenant, method, path bool
}

// add merges o into r, keeping header names unique.
func (r *reads) add(o reads) {
	for _, n := range o.headerNames {
		r.addHeader(n)
	}
	r.user, r.tenant = r.user || o.user, r.tenant || o.tenant
	r.method, r.path = r.method || o.method, r.path || o.path
}

func (r *reads) addHeader(n string) {
	if n != "" && !slices.Contains(r.headerNames, n) {
		r.headerNames = append(r.headerNames, n)
	}
}

// minus is what r reads that done does not.
func (r reads) minus(done reads) reads {
	out := reads{user: r.user && !done.user, tenant: r.tenant && !done.tenant,
		method: r.method && !done.method, path: r.path && !done.path}
	for _, n := range r.headerNames {
		if !slices.Contains(done.headerNames, n) {
			out.headerNames = append(out.headerNames, n)
		}
	}
	return out
}

// ruleState is one rule of a policyState.
type ruleState struct {
	index  int
	cr     *rules.CompiledRule
	layout *table.Layout
	// keys[n] is the shared-data key of bucket n.
	keys []string
	m    *ruleMetrics
	// order is the commit order class: 0 adjustable, 1 concurrency, 2
	// sliding_log (see the package doc's exactness argument).
	order       int
	concurrency bool
	// fleet is the fleet part of a "scope": "fleet" rule (fleet.go).
	fleet fleetRule
	// local is the limiter of a degraded "local" request of a small bucket,
	// built for the share localShareOf (localLimiter).
	local        limit.Limiter
	localShareOf uint64
	// windowSeconds is RateLimit-Policy's w parameter (policyWindowSeconds):
	// the window a client may pace the rule's limit header by, in whole
	// seconds, rounded up (0 for concurrency).
	windowSeconds uint64
	// replyPrefix is the constant start of the rule's local-reply body
	// (replyBodyPrefix); stateRule the filter state's rule member,
	// ,"rule":"<id>".
	replyPrefix []byte
	stateRule   []byte
	// statePrefix is the filter state of a request this rule reports, up
	// to its key member, for each stateHead (index stateHeadIndex):
	// {"rate_limited":…,"shadow":…,"policy_version":<the policy's>,"rule":"<id>"
	// in one constant, so writeState appends it at once.
	statePrefix [4][]byte
	// limitMember is the filter state's limit member for the limit the
	// rule's limiter reports (limit.Decision.Limit, the same on every
	// decision; a degraded fleet request's local share keeps the capacity),
	// ,"limit":<limitOf>, so writeState appends it at once.
	limitMember []byte
	limitOf     uint64
	// policyVersion is the version of the policy the rule belongs to (the
	// one statePrefix names).
	policyVersion uint64
	// stateSize is the rule's limiter state size in bytes
	// (limit.Limiter.StateSize; a degraded fleet rule's local limiter has
	// the same), read once.
	stateSize int
	// headers and headersOnAllow are the policy's response headers
	// (response_headers, else the configuration's headers and
	// headers_on_allow), kept with each rule so that a report carries them.
	headers        config.HeaderStyle
	headersOnAllow bool
}

// allHeadersThreshold is the number of distinct headers above which the
// filter reads the whole request header map once instead of one header at
// a time.
const allHeadersThreshold = 8

// OnPluginStart implements proxy_on_configure: it parses the plugin
// configuration (package config), installs the static policy, makes sure
// the hash key exists, defines the metrics and starts the tick. Any
// configuration error fails the configure with an error log naming the
// field, and Envoy refuses the filter.
func (p *pluginContext) OnPluginStart(pluginConfigurationSize int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, proxywasm.ErrNotFound) {
		proxywasm.LogError("sluice: reading the plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	cfg, err := config.Parse(raw)
	if err == nil {
		err = resolveTokens(&cfg.ControlPlane)
	}
	if err != nil {
		proxywasm.LogError("sluice: invalid plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.m.define()
	// The hash key first: creating keys below uses its cas as a witness.
	p.loadHashKey(true)
	p.fleetStart()
	if cfg.Policy != nil {
		if err := p.swapPolicy(cfg.Policy); err != nil {
			proxywasm.LogError("sluice: invalid plugin configuration: " + err.Error())
			return types.OnPluginStartStatusFailed
		}
		if err := p.createBuckets(cfg.Policy); err != nil {
			proxywasm.LogWarn("sluice: creating the static policy's counters: " + err.Error())
		}
	} else {
		proxywasm.LogInfo("sluice: no static policy; fail_mode " + cfg.FailMode.String() + " until one arrives")
	}
	if err := p.startSync(); err != nil {
		proxywasm.LogError("sluice: invalid plugin configuration: control_plane: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.startFirstPolicyHold()
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(cfg.Tick.Milliseconds())); err != nil {
		proxywasm.LogWarn("sluice: setting the tick period: " + err.Error())
	}
	return types.OnPluginStartStatusOK
}

// OnTick implements proxy_on_tick: every VM re-reads the hash key so that
// all converge on the stored one, and hands its metric increments to the
// host. Rule sync (filter/internal/policysync) applies a newly published
// policy with swapPolicy and, on the lease holder, polls the control plane.
func (p *pluginContext) OnTick() {
	p.loadHashKey(!p.hashKeyOK)
	if p.sync != nil {
		p.sync.Tick()
	}
	p.firstPolicyTick()
	p.retireTick()
	p.fleetTick()
	p.flushMetrics()
}

// OnPluginDone hands the pending metric increments to the host before the
// root context goes away; the sync lease holder hands the lease back, so
// another worker polls at once.
func (p *pluginContext) OnPluginDone() bool {
	if p.sync != nil {
		p.sync.Stop()
	}
	p.fleetDone()
	p.flushMetrics()
	return true
}

// swapPolicy makes c the policy in use, from the next request on. Rules
// keep their counters when their id and limiter are unchanged (the
// shared-data keys do not contain the version; the bucket header carries
// the limiter fingerprint); rules c drops lose their metrics and, a few
// ticks later, their counters (retire.go). It fails, leaving the current policy in place,
// if a rule's bucket would exceed table.MaxBucketSize with the configured
// entries_per_bucket. It makes hostcalls (metric definitions), so call it
// from proxy_on_configure or proxy_on_tick / an HTTP-call callback.
func (p *pluginContext) swapPolicy(c *rules.Compiled) error {
	if c == nil {
		p.dropPolicy()
		return nil
	}
	ps, err := p.buildPolicy(c)
	if err != nil {
		return err
	}
	p.dropRules(p.pol, c)
	old := p.pol
	p.pol = ps
	p.fleetPolicyChanged(old)
	p.m.policyVersion.Record(c.Version)
	proxywasm.LogInfo("sluice: policy " + c.Name + " version " + strconv.FormatUint(c.Version, 10) +
		" in use (" + strconv.Itoa(c.Len()) + " rules)")
	return nil
}

// dropPolicy runs when the pulled policy was deleted at the control plane
// (swapPolicy(nil)): the static policy of the configuration is enforced again,
// or, without one, no policy at all (fail_mode decides, reason "no_policy"), as
// before the first policy arrived. The dropped rules' counters are retired.
func (p *pluginContext) dropPolicy() {
	if p.cfg.Policy != nil {
		if err := p.swapPolicy(p.cfg.Policy); err == nil {
			proxywasm.LogInfo("sluice: the pulled policy was deleted at the control plane; the static policy is in use again")
			return
		}
	}
	old := p.pol
	if old != nil {
		p.dropRulesKeeping(old, old.compiled.Name, old.version+1, nil)
	}
	p.pol = nil
	p.fleetPolicyChanged(old)
	p.m.policyVersion.Record(0)
	proxywasm.LogInfo("sluice: the policy was deleted at the control plane; none in use (fail_mode " + p.cfg.FailMode.String() + ")")
}

// policyVersion returns the version of the policy in use and whether there
// is one.
func (p *pluginContext) policyVersion() (uint64, bool) {
	if p.pol == nil {
		return 0, false
	}
	return p.pol.version, true
}

func (p *pluginContext) buildPolicy(c *rules.Compiled) (*policyState, error) {
	if err := p.cfg.CheckPolicy(c, "policy"); err != nil {
		return nil, err
	}
	ps := &policyState{
		compiled:     c,
		version:      c.Version,
		rules:        make([]ruleState, c.Len()),
		userHeader:   c.Policy.Identity.UserHeader,
		tenantHeader: c.Policy.Identity.TenantHeader,
	}
	headers, onAllow := p.cfg.Headers, p.cfg.HeadersOnAllow
	if rh := c.Policy.ResponseHeaders; rh != nil {
		headers, _ = config.HeaderStyleNamed(rh.Set) // validated by rules.Compile
		onAllow = rh.OnAllow
	}
	// Every header a rule names is read as a header, pseudo-headers
	// included: req.Method and req.Path (method, path) serve the
	// "method"/"path" key parts and path/method matches, not req.Header,
	// which header conditions and "header:<name>" key parts use.
	match := reads{user: len(c.Policy.Exempt.Users) > 0,
		tenant: len(c.Policy.Exempt.Tenants) > 0}
	var key reads
	layoutName := p.layout()
	for i := range ps.rules {
		cr := c.Rule(i)
		layout, _ := table.New(cr.Limiter, p.cfg.EntriesPerBucket) // checked by CheckPolicy
		rs := &ps.rules[i]
		rs.index, rs.cr, rs.layout = i, cr, layout
		rs.stateSize = cr.Limiter.StateSize()
		rs.keys = make([]string, p.cfg.BucketsPerRule)
		prefix := bucketKeyPrefix(c.Name, cr.ID, layoutName)
		for n := range rs.keys {
			rs.keys[n] = prefix + strconv.Itoa(n)
		}
		rs.m = p.ruleMetrics(cr.ID)
		switch cr.Config.Algorithm {
		case limit.Concurrency:
			rs.order, rs.concurrency = 1, true
		case limit.SlidingLog:
			rs.order = 2
		}
		rs.windowSeconds = policyWindowSeconds(cr)
		msg := messageLimited
		if rs.concurrency {
			msg = messageConcurrency
		}
		rs.replyPrefix = replyBodyPrefix(cr.Status, msg, cr.ID)
		rs.stateRule = strictjson.AppendString([]byte(`,"rule":`), cr.ID)
		rs.policyVersion = c.Version
		for i := range rs.statePrefix {
			b := append([]byte(stateHead(i&2 != 0, i&1 != 0)), `,"policy_version":`...)
			b = strconv.AppendUint(b, c.Version, 10)
			rs.statePrefix[i] = append(b, rs.stateRule...)
		}
		rs.limitOf = cr.Limiter.Decide(nil, make([]byte, rs.stateSize), 0, 0).Limit
		rs.limitMember = strconv.AppendUint([]byte(`,"limit":`), rs.limitOf, 10)
		rs.headers, rs.headersOnAllow = headers, onAllow
		p.initFleetRule(c, rs)
		r := cr.Rule
		for _, h := range r.Match.Headers {
			match.addHeader(h.Name)
		}
		match.add(reads{user: len(r.Exempt.Users) > 0,
			tenant: len(r.Exempt.Tenants) > 0, method: len(r.Match.Methods) > 0,
			path: r.Match.Path != "" || r.Match.PathPrefix != ""})
		ks := cr.KeySources()
		for _, h := range ks.Headers {
			key.addHeader(h)
		}
		key.add(reads{user: ks.User, tenant: ks.Tenant, method: ks.Method, path: ks.Path})
		key.addHeader(r.CostHeader)
	}
	for _, r := range []*reads{&match, &key} {
		if r.user {
			r.addHeader(ps.userHeader)
		}
		if r.tenant {
			r.addHeader(ps.tenantHeader)
		}
	}
	ps.match, ps.key = match, key.minus(match)
	ps.allHeaders = len(ps.match.headerNames)+len(ps.key.headerNames) > allHeadersThreshold
	return ps, nil
}

// resolveTokens reads the tokens the control_plane section names by environment
// variable (token_env, quota_token_env) from the VM's environment, warning of one
// that is unset (the calls then carry no token) and failing on one that is not a
// valid token; and it warns of a token written in the plugin configuration itself,
// where whoever can read the configuration (a WasmPlugin, an
// EnvoyExtensionPolicy) reads the token.
func resolveTokens(cp *config.ControlPlane) error {
	if !cp.Enabled {
		return nil
	}
	for _, t := range []struct {
		env   string
		token *string
		field string
	}{{cp.TokenEnv, &cp.Token, "token"}, {cp.QuotaTokenEnv, &cp.QuotaToken, "quota_token"}} {
		if t.env == "" {
			if *t.token != "" {
				proxywasm.LogWarn("sluice: control_plane." + t.field + " is written in the plugin configuration, readable by anyone who can read it; " +
					"name an environment variable with " + t.field + "_env instead (vm_config.environment_variables, filled from a Secret)")
			}
			continue
		}
		v, ok := proxywasm.Getenv(t.env)
		if !ok || v == "" {
			// Not a configuration error: refusing it would make Envoy reject the
			// whole listener. The calls go without the token; a control plane that
			// needs one answers 401, and the filter degrades as its fail_mode and
			// the rules' on_quota_failure say.
			proxywasm.LogWarn("sluice: control_plane." + t.field + "_env: the VM's environment has no " + t.env +
				" (set it in vm_config.environment_variables: host_env_keys from the proxy's environment, or key_values); calls go without it")
			continue
		}
		if !config.Printable(v, config.MaxTokenBytes) {
			return errors.New("control_plane." + t.field + "_env: " + t.env + " must hold 1 to " + strconv.Itoa(config.MaxTokenBytes) + " visible ASCII bytes")
		}
		*t.token = v
	}
	return nil
}

// policyWindowSeconds is the w of a rule's RateLimit-Policy
// (draft-ietf-httpapi-ratelimit-headers-09, section 3: a policy allows q units,
// the limit header, per w seconds). For a window algorithm it is the rule's window;
// for a token_bucket or gcra, whose limit header is the bucket's capacity, it is the
// time the bucket takes to refill that capacity, capacity·window/limit, rounded up
// to a whole second so that a client pacing q per w never outruns the refill
// (rounded from nanoseconds: at most a second longer than exact). 0 for
// concurrency, which has no window.
func policyWindowSeconds(cr *rules.CompiledRule) uint64 {
	c := cr.Config
	capacity := c.Capacity()
	if capacity == 0 || c.Limit == 0 {
		return cr.PeriodSeconds
	}
	hi, lo := bits.Mul64(capacity, uint64(c.Window))
	if hi >= c.Limit {
		return cr.PeriodSeconds // beyond any client's interest: the window says it
	}
	ns, rem := bits.Div64(hi, lo, c.Limit)
	if rem != 0 {
		ns++
	}
	return max((ns+uint64(time.Second)-1)/uint64(time.Second), 1)
}
