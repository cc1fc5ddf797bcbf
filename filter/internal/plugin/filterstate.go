package plugin

import (
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

// Filter-state properties (Envoy: wasm.sluice.*, read in access logs with
// %FILTER_STATE(wasm.sluice.rate_limited:PLAIN)%). All values are strings;
// see the README's "Access-log metadata" section.
var (
	propRateLimited   = []string{"sluice.rate_limited"}
	propRule          = []string{"sluice.rule"}
	propKey           = []string{"sluice.key"}
	propLimit         = []string{"sluice.limit"}
	propRemaining     = []string{"sluice.remaining"}
	propReset         = []string{"sluice.reset"}
	propShadow        = []string{"sluice.shadow"}
	propPolicyVersion = []string{"sluice.policy_version"}
	propReason        = []string{"sluice.reason"}
	propTraceID       = []string{"sluice.trace_id"}

	valTrue  = []byte("true")
	valFalse = []byte("false")
)

func boolBytes(b bool) []byte {
	if b {
		return valTrue
	}
	return valFalse
}

// setState writes the request's filter state: rate_limited, shadow and
// policy_version always; rule, key, limit, remaining and reset when a rule
// counted the request; reason when it failed open. It must run in the
// request-headers callback (the key is read from scratch), before any
// access logger (envoyproxy/envoy#30859; docs/ENVOY.md, Properties and
// filter state).
func (h *httpContext) setState(ps *policyState, reason string) {
	p := h.p
	r := &h.report
	setProp(propRateLimited, boolBytes(h.hasReport && r.rateLimited))
	setProp(propShadow, boolBytes(h.hasReport && r.shadow))
	if ps != nil {
		setProp(propPolicyVersion, ps.versionStr)
	}
	if reason != "" {
		setProp(propReason, bytesOf(reason))
	}
	if !h.hasReport {
		return
	}
	h.setFleetState()
	setProp(propRule, bytesOf(r.rule.cr.ID))
	if h.keyEnd <= len(p.s.key) {
		setProp(propKey, p.s.key[h.keyOff:h.keyEnd])
	}
	h.setNumbers()
}

// setNumbers writes limit, remaining and reset from the report.
func (h *httpContext) setNumbers() {
	p := h.p
	r := &h.report
	p.s.num = strconv.AppendUint(p.s.num[:0], r.limit, 10)
	setProp(propLimit, p.s.num)
	p.s.num = strconv.AppendUint(p.s.num[:0], r.remaining, 10)
	setProp(propRemaining, p.s.num)
	p.s.num = strconv.AppendUint(p.s.num[:0], r.resetSeconds, 10)
	setProp(propReset, p.s.num)
}

// setFailOpenState records a request that passed without a decision.
func (h *httpContext) setFailOpenState(reason string) {
	setProp(propRateLimited, valFalse)
	setProp(propShadow, valFalse)
	if v, ok := h.p.policyVersion(); ok {
		h.p.s.num = strconv.AppendUint(h.p.s.num[:0], v, 10)
		setProp(propPolicyVersion, h.p.s.num)
	}
	setProp(propReason, bytesOf(reason))
}

// setFailClosedState records a request denied for want of a policy.
func (h *httpContext) setFailClosedState() {
	setProp(propRateLimited, valTrue)
	setProp(propShadow, valFalse)
	setProp(propReason, bytesOf(reasonNoPolicy))
}

func setProp(path []string, v []byte) {
	if err := proxywasm.SetProperty(path, v); err != nil {
		proxywasm.LogDebug("sluice: setting filter state " + path[0] + ": " + err.Error())
	}
}
