// Package plugin is sluice's proxy-wasm plugin: it enforces a rate-limit
// policy (package rules) on every HTTP request, with counters that every
// worker VM of an Envoy shares through proxy-wasm shared data, and records
// each decision as filter state for the access log.
//
// The code is split by lifecycle phase: configure.go (plugin
// configuration, policy swap, hash key, metrics), request.go (request
// headers: client, matching, decision), commit.go (the shared-data
// read–decide–CAS protocol), reply.go (the local reply and the rate-limit
// headers), response.go (response headers: headers on allowed responses,
// response-cost correction), done.go (stream end: concurrency release),
// fleet.go (fleet-scoped rules: quota leases, waits for the quota service,
// on_quota_failure).
//
// # Shared data
//
// Counters live under "sluice/<policy>/<rule-id>/<layout>/<n>", n in
// [0, buckets_per_rule), layout "e<entries_per_bucket>b<buckets_per_rule>":
// one table.Layout bucket each. Configurations of one vm_id with different
// layouts count separately. A request's counter
// key (rules.Compiled.AppendKey) is hashed with SipHash-2-4 under a 16-byte
// per-Envoy secret stored at "sluice/hashkey", and table.BucketOf picks
// the bucket. The bucket header carries the limiter's fingerprint, so a
// rule whose algorithm or parameters change starts fresh while an unchanged
// rule keeps its counters across policy versions. Memory per rule is
// buckets_per_rule × bucket size, whatever the traffic.
//
// # Exactness
//
// A request is decided against every matching rule from the buckets'
// current bytes before anything is written. If any enforced (non-shadow)
// rule denies, nothing is written: a denied request consumes nothing.
// Otherwise each bucket is written with compare-and-swap against the cas
// it was read with; on a mismatch that bucket is re-read and its rule
// re-decided (at most cas_retries re-reads per rule). If a
// re-decision now denies, the rules already written are compensated
// (limit.Limiter.Adjust with the negative cost, or Release for concurrency,
// each again by CAS), and the request is denied, so a denied request takes
// nothing. Since every write is a CAS over the bytes the decision was made
// from, no admission is ever based on stale state, and the admitted total
// never exceeds a limit. Rules are written in the order token-adjustable
// first, concurrency next, sliding_log last (sliding_log state cannot be
// corrected), so only a request matching two or more sliding_log rules can
// leave a charge behind when denied during its commit (counted in
// sluice.compensation_lost).
//
// A key that does not exist yet is written with cas 0xFFFFFFFF rather than
// 0: Envoy creates a new key whatever the cas, but a cas-0 write over a key
// another worker created meanwhile would be unconditional and lose its
// update; a non-zero cas makes that write fail with CAS_MISMATCH instead.
// (Residual: if the key's stored cas is exactly 0xFFFFFFFF, one of 2^32
// values, the write succeeds over it.)
//
// # Failure policy
//
// Bad configuration stops the plugin from starting: proxy_on_configure
// fails with an error log naming the field, and Envoy refuses the filter.
// Trouble while serving a request is logged (at debug level, since it can
// be frequent), counted in a metric, recorded in filter state
// (filter state reason), and the request passes: shared data unreadable
// ("shared_data_error"), no hash key ("no_hash_key"), no policy with
// fail_mode "open" ("no_policy"). With fail_mode "closed" and no policy at
// all the filter denies with 503 (reason "no_policy"). A rule that runs out
// of CAS retries ("cas_exhausted") denies the request with its status under
// cas_fail_mode "closed" (the default: a flood makes its key the most
// contended one, and passing there would weaken the rule exactly when it
// matters), after compensating the charges already written; under "open"
// the request passes. Compensations, releases and response-cost
// corrections retry at least minModifyRetries times, since a lost one
// leaves a charge behind. Nothing a client sends can make the filter panic; a panic
// that happened anyway is recovered by filter/proxywasm, which fails open.
package plugin

import (
	"net/netip"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/filter/internal/policysync"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// NewVMContext returns the VM context to register with
// proxywasm.SetVMContext from init. It makes no hostcall.
func NewVMContext() types.VMContext { return &vmContext{} }

type vmContext struct {
	types.DefaultVMContext
}

// NewPluginContext is called for each root context (one per plugin
// configuration per worker VM, plus the canary).
func (*vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	p := &pluginContext{}
	p.ipSource = p.clientIP
	return p
}

// pluginContext is one root context: the configuration, the policy in use
// and the per-VM scratch buffers the request path reuses (a VM runs one
// callback at a time, so they are never shared).
type pluginContext struct {
	types.DefaultPluginContext

	cfg config.Config
	// pol is the policy in use; nil means none (fail_mode applies). It is
	// replaced only by swapPolicy.
	pol *policyState
	// sync pulls the policy from the control plane (sync.go); nil
	// without a control_plane section.
	sync *policysync.Syncer

	hashKey   siphash.Key
	hashKeyOK bool

	m         metrics
	ruleStats map[string]*ruleMetrics
	// retiring is the rules the last swaps dropped, whose buckets retireTick
	// shrinks; nil if none.
	retiring *retirement

	// fleet is the worker's state of fleet-scoped rules (fleet.go).
	fleet fleetWorker
	// first holds requests that arrive before the first policy
	// (firstpolicy.go).
	first firstPolicy

	// free is a list of finished HTTP contexts to reuse.
	free []*httpContext

	// ipSource is clientIP as the rules.Request's ClientIPSource, made
	// once so that setting it per request allocates nothing.
	ipSource func() netip.Addr

	s scratch
}

// scratch holds the buffers of one request's evaluation, reused across
// requests. Buffers that grew past maxKeepBytes are dropped after use.
type scratch struct {
	req     rules.Request
	headers []rules.Header
	// haveAll: headers holds the whole request header map (allHeaders).
	haveAll bool
	matched []int
	key     []byte
	evals   []eval
	next    []byte
	bucket  []byte
	// mod and modBucket serve modify (compensation, response cost,
	// release), which may run while next and bucket are in use.
	mod       []byte
	modBucket []byte
	num       []byte
	// state is the filter-state value (writeState); body, replyHeaders
	// and replyText the local reply (sendReply); trace a local reply's
	// trace id as a JSON string (traceJSON), for both.
	state        []byte
	body         []byte
	trace        []byte
	replyHeaders [][2]string
	replyText    []byte
	// lastNums is the numbers replyText begins with (formatNumbers);
	// replyPairs the last reply's headers in the pairs encoding, and
	// pairsOf what they were made of (sendReply).
	lastNums   numbersMemo
	replyPairs []byte
	pairsOf    replyHeadersOf
	// bodyHead is how much of body is the last reply's body up to its
	// trace id, made of bodyOf (sendReply).
	bodyHead int
	bodyOf   replyBodyOf
	// ts is the reply timestamp of second tsSec (appendTimestamp).
	ts    []byte
	tsSec int64
}

const maxKeepBytes = 64 << 10

// NewHttpContext is called for each HTTP stream.
func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	if n := len(p.free); n > 0 {
		h := p.free[n-1]
		p.free = p.free[:n-1]
		*h = httpContext{p: p, charges: h.charges[:0], fq: fleetReq{id: contextID}}
		return h
	}
	return &httpContext{p: p, fq: fleetReq{id: contextID}}
}

// recycle returns a finished context to the free list (bounded).
func (p *pluginContext) recycle(h *httpContext) {
	if len(p.free) < 64 {
		p.free = append(p.free, h)
	}
}
