package plugin

import (
	"net/netip"
	"time"
	"unsafe"

	"github.com/sluice-proxy/sluice/filter/internal/config"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// httpContext is one HTTP stream: what the request-headers decision found,
// for the response headers, and what it acquired, for the stream's end.
type httpContext struct {
	types.DefaultHttpContext
	p *pluginContext

	// denied: the filter answered with a local reply.
	denied bool
	// report is the decision reported in response headers and filter state
	// (valid when hasReport).
	report    report
	hasReport bool
	// keyOff and keyEnd locate the reported rule's counter key in
	// scratch.key during the request-headers callback.
	keyOff, keyEnd int
	// charges are the counters this request was committed to, for the
	// response-cost correction and the concurrency release.
	charges []charge
	// fq is the fleet part (fleet.go): stream id and quota waits.
	fq fleetReq
	// heldSeq is non-zero while the request is held for the first policy
	// (firstpolicy.go).
	heldSeq uint64
}

// report is one rule's decision as the headers and filter state show it.
type report struct {
	rule                *ruleState
	limit, remaining    uint64
	resetSeconds        uint64
	retryAfterSeconds   uint64
	shadow, rateLimited bool
}

// charge is one counter a request was committed to.
type charge struct {
	rule       *ruleState
	bucket     int
	hash       uint64
	cost       uint64
	acquiredAt int64 // the now of the Decide, Unix ns
}

// Request header names the filter always reads.
const (
	headerMethod      = ":method"
	headerPath        = ":path"
	headerRequestID   = "x-request-id"
	headerTraceparent = "traceparent"
)

var propSourceAddress = []string{"source", "address"}

// OnHttpRequestHeaders decides the request: exemptions, every matching
// rule, then commit or deny (see the package doc).
func (h *httpContext) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	p := h.p
	var now int64 // the request's one clock reading, once taken
	if p.sync != nil {
		now = clockNow()
		p.sync.Check(now) // a newly published policy applies from this request on
	}
	ps := p.pol
	if ps == nil {
		if h.holdForPolicy() {
			return types.ActionPause // decided on the tick that finds a policy
		}
		p.m.noPolicy.Increment(1)
		if p.cfg.FailMode == config.FailClosed {
			h.denyNoPolicy()
			return types.ActionPause
		}
		p.m.failedOpen.Increment(1)
		h.setFailOpenState(reasonNoPolicy)
		return types.ActionContinue
	}
	if !p.hashKeyOK {
		p.loadHashKey(true)
		if !p.hashKeyOK {
			p.m.failedOpen.Increment(1)
			proxywasm.LogDebug("sluice: no hash key; request passes")
			h.setFailOpenState(reasonNoHashKey)
			return types.ActionContinue
		}
	}
	// From here on the request path keeps no host buffer past the
	// callback (releaseScratch drops the views; keys and charges are
	// copies), so every buffer a hostcall returns comes from the binding's
	// reused scratch: a warm request allocates nothing. The policy sync
	// check and the hash key above keep what they read, so they run
	// outside the scope. The scope ends when the callback returns.
	proxywasm.BeginHostScratch()
	req := p.readRequest(ps)
	s := &p.s
	s.matched = ps.compiled.Match(req, s.matched[:0])
	if len(s.matched) == 0 {
		// No rule applies: no clock read, no filter state (the access log
		// shows none), nothing but the reads matching needed.
		p.releaseScratch()
		return types.ActionContinue
	}
	p.readKeyParts(ps, req)
	if now == 0 {
		now = clockNow()
	}
	out := h.evaluate(ps, req, now)
	var action types.Action = types.ActionContinue
	switch {
	case out.wait:
		action = types.ActionPause // resumed or answered by the quota answer (fleet.go)
	case out.deny != nil:
		h.deny(ps, out.deny, now)
		action = types.ActionPause
	default:
		h.keepCharges(now)
		h.setState(ps, out.failed)
	}
	p.releaseScratch()
	return action
}

// readRequest fills the reused rules.Request with what matching needs
// (ps.match); readKeyParts adds what keys and costs need once a rule
// matched (ps.key). Header values are views of host buffers: nothing is
// copied, and nothing outlives the callback except what keepCharges and
// the report copy.
func (p *pluginContext) readRequest(ps *policyState) *rules.Request {
	s := &p.s
	req := &s.req
	*req = rules.Request{Headers: s.headers[:0], ClientIPSource: p.ipSource}
	s.haveAll = false
	// The whole map can fail to decode (pairs.DecodeString refuses more
	// than 1024 pairs or 1 MiB, limits Envoy applies only to maps from the
	// guest): a client sending that many headers then gets the same
	// one-at-a-time reads, not a request without headers.
	if ps.allHeaders {
		if all, err := proxywasm.GetHttpRequestHeaders(); err == nil {
			for _, kv := range all {
				req.Headers = append(req.Headers, rules.Header{Name: kv[0], Value: kv[1]})
			}
			s.haveAll = true
		}
	}
	p.read(ps, &ps.match, req)
	return req
}

// readKeyParts reads what ps.key names into req (after readRequest).
func (p *pluginContext) readKeyParts(ps *policyState, req *rules.Request) {
	p.read(ps, &ps.key, req)
}

// read performs one phase's reads r into req.
func (p *pluginContext) read(ps *policyState, r *reads, req *rules.Request) {
	s := &p.s
	if r.method {
		req.Method, _ = proxywasm.GetHttpRequestHeader(headerMethod)
	}
	if r.path {
		path, _ := proxywasm.GetHttpRequestHeader(headerPath)
		req.Path = rules.PathOnly(path)
	}
	if !s.haveAll {
		for _, name := range r.headerNames {
			if v, err := proxywasm.GetHttpRequestHeader(name); err == nil {
				req.Headers = append(req.Headers, rules.Header{Name: name, Value: v})
			}
		}
	}
	s.headers = req.Headers
	if r.user && ps.userHeader != "" {
		req.User, _ = req.Header(ps.userHeader)
	}
	if r.tenant && ps.tenantHeader != "" {
		req.Tenant, _ = req.Header(ps.tenantHeader)
	}
}

// clientIP returns the client address: source.address, the trusted client
// address Envoy's HTTP connection manager computed before any filter ran
// (use_remote_address, xff_num_trusted_hops, or an original-IP-detection
// extension; source/common/http/conn_manager_utility.cc) and set as the
// stream's downstream remote address, which the attribute returns
// (attributes.rst: "Downstream connection remote address"). X-Forwarded-For
// is not parsed a second time: Envoy's answer is the only one, so the
// filter and Envoy (access log, RBAC) agree on who the client is. The zero
// Addr means unknown.
func (p *pluginContext) clientIP() netip.Addr {
	src, err := proxywasm.GetProperty(propSourceAddress)
	if err != nil {
		return netip.Addr{}
	}
	return parseAddress(viewString(src))
}

// parseAddress parses "ip", "ip:port" or "[ipv6]:port"; the zero Addr if it
// is none of them.
func parseAddress(s string) netip.Addr {
	if len(s) > 64 {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

// viewString views a host buffer as a string without copying; the binding
// hands every hostcall result in a fresh buffer that nothing writes again.
func viewString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// clockNow is the host's wall clock in Unix nanoseconds: one
// proxy_get_current_time_nanoseconds (spec v0.2.1 "Timers"; Envoy answers
// from its time source). time.Now would cost two WASI clock_time_get
// calls under wasip1 (wall and monotonic). If the host refuses, time.Now.
func clockNow() int64 {
	if t, err := proxywasm.GetCurrentTimeNanoseconds(); err == nil {
		return t
	}
	return time.Now().UnixNano()
}

// keyHash hashes a counter key under the per-Envoy secret.
func (p *pluginContext) keyHash(key []byte) uint64 { return siphash.Sum64(p.hashKey, key) }

// releaseScratch drops scratch buffers that grew past maxKeepBytes (a
// hostile header can make a key long) and the views of host buffers.
func (p *pluginContext) releaseScratch() {
	s := &p.s
	if cap(s.key) > maxKeepBytes {
		s.key = nil
	}
	if cap(s.headers) > 1024 {
		s.headers = nil
	}
	clear(s.headers[:cap(s.headers)])
	s.req = rules.Request{}
	evals := s.evals[:cap(s.evals)]
	for i := range evals {
		evals[i].value = nil
	}
}
