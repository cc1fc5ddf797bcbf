package plugin

import (
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// propState is the one filter-state value the filter writes per request:
// Envoy stores it as wasm.sluice (a CelState, envoy context.cc
// Context::setProperty) and the access log reads it with
// %FILTER_STATE(wasm.sluice:PLAIN)%. It is a JSON object (see stateRecord
// and docs/filter.md, "Filter: access-log metadata"); one value costs one hostcall,
// where a value per field cost one each (docs/RATIONALE.md, "One
// filter-state value").
var propState = []string{"sluice"}

// stateRecord is what the filter state says of a request besides the
// reported rule (h.report), which writeState adds when h.hasReport.
type stateRecord struct {
	rateLimited bool
	version     uint64 // policy_version, when hasVersion
	hasVersion  bool
	reason      string // reason, when not empty
	traceID     []byte // trace_id as a JSON string (traceJSON), when the id is not empty (local replies only)
	// nums, when set, are the reported rule's remaining and reset already
	// in decimal (a local reply's, formatNumbers).
	nums *replyNumbers
}

// writeState writes the request's filter state in one hostcall:
//
//	{"rate_limited":false,"shadow":false,"policy_version":3,
//	 "rule":"per-user","key":"rl:…","limit":100,"remaining":99,"reset":60,
//	 "scope":"fleet","quota":"local","reason":"…","trace_id":"…"}
//
// rate_limited and shadow are always present; policy_version when a
// policy is loaded; rule, key, limit (cost units), remaining (cost units)
// and reset (seconds, rounded up) when a rule counted the request; scope
// and quota for a fleet rule; reason when the filter could not decide (or
// a fleet rule degraded); trace_id with a local reply. It must run in the
// request-headers callback (the key is read from scratch), before any
// access logger (envoyproxy/envoy#30859; docs/ENVOY.md, Properties and
// filter state).
func (h *httpContext) writeState(st stateRecord) {
	p := h.p
	r := &h.report
	var b []byte
	if h.hasReport && st.hasVersion && st.version == r.rule.policyVersion {
		// The common case: head, version and rule in one constant.
		b = append(p.s.state[:0], r.rule.statePrefix[stateHeadIndex(st.rateLimited, r.shadow)]...)
	} else {
		b = append(p.s.state[:0], stateHead(st.rateLimited, h.hasReport && r.shadow)...)
		if st.hasVersion {
			b = append(b, `,"policy_version":`...)
			b = strconv.AppendUint(b, st.version, 10)
		}
		if h.hasReport {
			b = append(b, r.rule.stateRule...)
		}
	}
	if h.hasReport {
		if h.keyEnd <= len(p.s.key) {
			b = append(b, `,"key":`...)
			b = strictjson.AppendString(b, viewString(p.s.key[h.keyOff:h.keyEnd]))
		}
		if r.limit == r.rule.limitOf {
			b = append(b, r.rule.limitMember...)
		} else { // a limiter that reports another limit (none does today)
			b = appendUintMember(b, `,"limit":`, r.limit)
		}
		if st.nums != nil {
			b = append(b, `,"remaining":`...)
			b = append(b, st.nums.remaining...)
			b = append(b, `,"reset":`...)
			b = append(b, st.nums.reset...)
		} else {
			b = appendUintMember(b, `,"remaining":`, r.remaining)
			b = appendUintMember(b, `,"reset":`, r.resetSeconds)
		}
		if quota, degraded, ok := h.fleetState(); ok {
			b = append(b, `,"scope":"fleet","quota":"`...)
			b = append(b, quota...)
			b = append(b, '"')
			if degraded && st.reason == "" {
				st.reason = reasonQuotaUnavailable
			}
		}
	}
	if st.reason != "" {
		b = append(b, `,"reason":`...)
		b = strictjson.AppendString(b, st.reason)
	}
	if st.traceID != nil {
		b = append(b, `,"trace_id":`...)
		b = append(b, st.traceID...)
	}
	b = append(b, '}')
	if err := proxywasm.SetProperty(propState, b); err != nil {
		proxywasm.LogDebug("sluice: setting filter state: " + err.Error())
	}
	if cap(b) <= maxKeepBytes {
		p.s.state = b[:0]
	}
}

// stateHeadIndex is the index of stateHead(rateLimited, shadow) in
// ruleState.statePrefix.
func stateHeadIndex(rateLimited, shadow bool) int {
	i := 0
	if rateLimited {
		i = 2
	}
	if shadow {
		i++
	}
	return i
}

// appendUintMember appends name (a JSON member's `,"name":`, or "") and v
// in decimal. Go's wasm code takes every jump back to a loop's head through
// its function's block dispatch, so one copy and strconv's two digits a
// step beat writing byte by byte under V8 (38 against 71 ns a number in a
// micro-benchmark, node 20), although they are more calls.
func appendUintMember(b []byte, name string, v uint64) []byte {
	return strconv.AppendUint(append(b, name...), v, 10)
}

// stateHead is the start of the filter state: its rate_limited and shadow
// members, written as one constant.
func stateHead(rateLimited, shadow bool) string {
	switch {
	case rateLimited && shadow:
		return `{"rate_limited":true,"shadow":true`
	case rateLimited:
		return `{"rate_limited":true,"shadow":false`
	case shadow:
		return `{"rate_limited":false,"shadow":true`
	}
	return `{"rate_limited":false,"shadow":false`
}

// setState records a decided request that was not denied (deny writes its
// own, with the trace id and the reply's numbers).
func (h *httpContext) setState(ps *policyState, reason string) {
	h.writeState(stateRecord{
		rateLimited: h.hasReport && h.report.rateLimited,
		version:     ps.version, hasVersion: true,
		reason: reason,
	})
}

// setFailOpenState records a request that passed without a decision.
func (h *httpContext) setFailOpenState(reason string) {
	v, ok := h.p.policyVersion()
	h.writeState(stateRecord{version: v, hasVersion: ok, reason: reason})
}

// setFailClosedState records a request denied for want of a policy.
func (h *httpContext) setFailClosedState(traceID []byte) {
	h.writeState(stateRecord{rateLimited: true, reason: reasonNoPolicy, traceID: traceID})
}
