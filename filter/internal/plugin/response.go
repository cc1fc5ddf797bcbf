package plugin

import (
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// OnHttpResponseHeaders adds the rate-limit headers of the most
// restrictive enforced rule to an allowed response (the policy's
// response_headers.on_allow, else headers_on_allow), and
// corrects the charge of rules with a response_cost_header.
func (h *httpContext) OnHttpResponseHeaders(numHeaders int, endOfStream bool) types.Action {
	if h.denied {
		return types.ActionContinue // the local reply carries its headers
	}
	proxywasm.BeginHostScratch() // nothing read here outlives the callback
	if h.hasReport && !h.report.rule.cr.Shadow && h.report.rule.headersOnAllow {
		h.addLimitHeaders()
	}
	for i := range h.charges {
		if h.charges[i].rule.cr.ResponseCostHeader != "" {
			h.correctCost(&h.charges[i])
		}
	}
	return types.ActionContinue
}

func (h *httpContext) addLimitHeaders() {
	p := h.p
	r := &h.report
	style := r.rule.headers
	if style.XRateLimit() {
		addNum(p, headerXLimit, r.limit)
		addNum(p, headerXRemaining, r.remaining)
		addNum(p, headerXReset, r.resetSeconds)
	}
	if style.IETF() {
		p.s.num = h.appendPolicyField(p.s.num[:0])
		_ = proxywasm.AddHttpResponseHeader(headerRateLimitPolicy, viewString(p.s.num))
		p.s.num = h.appendRateLimitField(p.s.num[:0])
		_ = proxywasm.AddHttpResponseHeader(headerRateLimit, viewString(p.s.num))
	}
}

func addNum(p *pluginContext, name string, v uint64) {
	p.s.num = appendUint(p.s.num[:0], v)
	_ = proxywasm.AddHttpResponseHeader(name, viewString(p.s.num))
}

// correctCost reads the rule's response cost header (a decimal integer,
// rules.ParseCost, clamped to rules.MinCost..the rule's max cost: a request
// never becomes free) and adjusts the charge
// by the difference. A missing or malformed value keeps the charge and is
// counted.
func (h *httpContext) correctCost(c *charge) {
	p := h.p
	cr := c.rule.cr
	v, err := proxywasm.GetHttpResponseHeader(cr.ResponseCostHeader)
	if err != nil {
		return
	}
	cost, ok := rules.ParseCost(v)
	if !ok {
		p.m.costInvalid.Increment(1)
		proxywasm.LogDebug("sluice: rule " + cr.ID + ": malformed response cost header")
		return
	}
	cost = max(min(cost, cr.MaxCost()), rules.MinCost)
	if cost == c.cost {
		return
	}
	delta := int64(cost) - int64(c.cost)
	lim := c.rule.layout.Limiter()
	now := clockNow()
	if p.modify(c.rule, c.rule.layout.Limiter(), c.bucket, c.hash, now, func(state, next []byte) bool {
		return lim.Adjust(state, next, now, delta)
	}) {
		c.cost = cost
	}
}
