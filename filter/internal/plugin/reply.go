package plugin

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// Local reply details (%RESPONSE_CODE_DETAILS%) and messages.
const (
	detailsLimited         = "sluice_rate_limited"
	detailsNoPolicy        = "sluice_no_policy"
	detailsCASExhausted    = "sluice_cas_exhausted"
	messageLimited         = "rate limit exceeded"
	messageConcurrency     = "too many concurrent requests"
	messageNoPolicy        = "no rate-limit policy loaded"
	maxRequestIDBytes      = 256
	headerContentType      = "content-type"
	headerRetryAfter       = "retry-after"
	headerXLimit           = "x-ratelimit-limit"
	headerXRemaining       = "x-ratelimit-remaining"
	headerXReset           = "x-ratelimit-reset"
	headerRateLimit        = "ratelimit"
	headerRateLimitPolicy  = "ratelimit-policy"
	contentTypeJSON        = "application/json"
	noPolicyRetryAfterSecs = 1
)

// setReport makes ev the reported decision.
func (h *httpContext) setReport(ev *eval, limited bool) {
	h.report = report{
		rule:         ev.rule,
		limit:        ev.dec.Limit,
		remaining:    ev.dec.Remaining,
		resetSeconds: ceilSeconds(ev.dec.Reset),
		rateLimited:  limited,
	}
	if limited {
		ra := ev.dec.RetryAfter
		if ra == limit.Never { // the cost exceeds the capacity: no wait helps
			ra = ev.dec.Reset
		}
		h.report.retryAfterSeconds = max(ceilSeconds(ra), 1)
	}
	h.keyOff, h.keyEnd = ev.keyOff, ev.keyEnd
	h.hasReport = true
}

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Second - 1) / time.Second)
}

// deny answers the request with the reported rule's local reply; a rule
// that ran out of CAS retries (cas_fail_mode "closed") answers the same
// way with details sluice_cas_exhausted and reason cas_exhausted. now is
// the request's one clock reading (the body's timestamp).
func (h *httpContext) deny(ps *policyState, ev *eval, now int64) {
	h.denied = true
	r := &h.report
	details, reason := detailsLimited, ""
	if ev.exhausted {
		details, reason = detailsCASExhausted, reasonCASExhausted
	}
	id, state := h.p.traceJSON()
	lr := localReply{
		status: ev.rule.cr.Status, details: details, prefix: ev.rule.replyPrefix,
		limit: r.limit, remaining: r.remaining, resetSeconds: r.resetSeconds,
		retryAfterSeconds: r.retryAfterSeconds, withLimits: true, traceID: id, now: now,
	}
	text := h.p.formatNumbers(&lr)
	h.writeState(stateRecord{
		rateLimited: h.hasReport && r.rateLimited, version: ps.version, hasVersion: true,
		reason: reason, traceID: state, nums: &lr.nums,
	})
	h.sendReply(&lr, text)
}

// denyNoPolicy answers 503 under fail_mode "closed" when there is no policy.
func (h *httpContext) denyNoPolicy() {
	h.denied = true
	id, state := h.p.traceJSON()
	h.setFailClosedState(state)
	lr := localReply{status: 503, details: detailsNoPolicy, prefix: noPolicyReplyPrefix,
		retryAfterSeconds: noPolicyRetryAfterSecs, traceID: id, now: clockNow()}
	h.sendReply(&lr, h.p.formatNumbers(&lr))
}

// localReply is what a local reply says.
type localReply struct {
	status            int    // HTTP status: the rule's (429 or 503), or 503
	details           string // Envoy's %RESPONSE_CODE_DETAILS%
	prefix            []byte // the body up to data.limit's value (replyBodyPrefix)
	limit, remaining  uint64 // the body's data.limit and data.remaining, in the rule's units
	resetSeconds      uint64 // the body's data.reset: seconds until the rule is back to full
	retryAfterSeconds uint64 // Retry-After, whole seconds
	withLimits        bool   // add the configured rate-limit headers of h.report
	traceID           []byte // the body's trace_id, a JSON string (traceJSON)
	now               int64  // the body's timestamp, Unix ns
	nums              replyNumbers
}

// replyNumbers are a local reply's four numbers in decimal (formatNumbers):
// each is written in the body, a header and the filter state, formatted once.
type replyNumbers struct{ limit, remaining, reset, retryAfter string }

// formatNumbers sets lr.nums, views of the reused buffer p.s.replyText (sized
// up front, so that no append moves it while views point into it), and
// returns the buffer for the reply's other header values (sendReply). A
// flood of denials from one key repeats the numbers of the reply before
// (the reset changes once a second): then the buffer already begins with
// them, and they are not formatted again.
func (p *pluginContext) formatNumbers(lr *localReply) []byte {
	m := &p.s.lastNums
	if cap(p.s.replyText) < replyTextBytes {
		p.s.replyText = make([]byte, 0, replyTextBytes)
		*m = numbersMemo{}
	}
	v := lr.values()
	if m.end > 0 && m.v == v {
		lr.nums = m.nums
		return p.s.replyText[:m.end]
	}
	text := p.s.replyText[:0]
	text, lr.nums.limit = appendView(text, lr.limit)
	text, lr.nums.remaining = appendView(text, lr.remaining)
	text, lr.nums.reset = appendView(text, lr.resetSeconds)
	text, lr.nums.retryAfter = appendView(text, lr.retryAfterSeconds)
	*m = numbersMemo{v: v, nums: lr.nums, end: len(text)}
	return text
}

// values is the reply's four numbers: limit, remaining, reset and
// retry-after (what formatNumbers formats and the kept reply parts are
// compared on).
func (lr *localReply) values() [4]uint64 {
	return [4]uint64{lr.limit, lr.remaining, lr.resetSeconds, lr.retryAfterSeconds}
}

// numbersMemo is the last reply's numbers (formatNumbers): their values
// (limit, remaining, reset, retry-after), their text, and where that text
// ends in p.s.replyText (0: none kept). Only the bytes after end are
// written by a reply's other header values.
type numbersMemo struct {
	v    [4]uint64
	nums replyNumbers
	end  int
}

// sendReply sends the JSON local reply
//
//	{"code":429,"message":"...","data":{"rule":"...","limit":n,"remaining":n,"reset":s},
//	 "timestamp":"<RFC 3339>","trace_id":"..."}
//
// with Content-Type, Retry-After (whole seconds, rounded up) and, when
// withLimits, the configured rate-limit headers. The body, the header list
// and the numbers in it are built in buffers reused across replies (a
// flood of denials allocates nothing), and the headers' encoding is kept
// for the next reply made of the same numbers and rule (at most a few
// hundred bytes: replyTextBytes bounds their values). The caller writes the
// filter state first, so the access log finds the same trace_id as the body.
func (h *httpContext) sendReply(lr *localReply, text []byte) {
	p := h.p
	// A flood of denials from one key repeats the body of the reply before
	// up to its trace id: that part is kept and reused within one second.
	v := lr.values()
	head := replyBodyOf{prefix: &lr.prefix[0], v: [3]uint64(v[:3]), sec: lr.now / int64(time.Second), ok: true}
	var b []byte
	if head == p.s.bodyOf && p.s.bodyHead <= cap(p.s.body) {
		b = p.s.body[:p.s.bodyHead]
	} else {
		b = append(p.s.body[:0], lr.prefix...)
		b = append(b, lr.nums.limit...)
		b = append(b, `,"remaining":`...)
		b = append(b, lr.nums.remaining...)
		b = append(b, `,"reset":`...)
		b = append(b, lr.nums.reset...)
		b = append(b, `},"timestamp":"`...)
		b = p.appendTimestamp(b, lr.now)
		b = append(b, `","trace_id":`...)
		p.s.bodyOf, p.s.bodyHead = head, len(b)
	}
	b = append(b, lr.traceID...)
	body := append(b, '}')

	// A flood of denials from one key sends the headers of the reply
	// before: their encoding is kept and sent again.
	of := replyHeadersOf{v: v, ok: true}
	if lr.withLimits {
		of.rule = h.report.rule
	}
	if of != p.s.pairsOf {
		// The header values are views of p.s.replyText (formatNumbers).
		headers := append(p.s.replyHeaders[:0],
			[2]string{headerContentType, contentTypeJSON},
			[2]string{headerRetryAfter, lr.nums.retryAfter})
		if lr.withLimits {
			headers, text = h.appendLimitHeaders(headers, text, &lr.nums)
		}
		p.s.replyPairs = pairs.AppendEncode(p.s.replyPairs[:0], headers)
		p.s.pairsOf = of
		clear(headers)
		p.s.replyHeaders = headers[:0]
		if cap(text) == replyTextBytes {
			p.s.replyText = text[:0]
		}
	}
	if err := proxywasm.SendHttpResponseEncoded(uint32(lr.status), lr.details, p.s.replyPairs, body, proxywasm.GrpcStatusNone); err != nil {
		proxywasm.LogWarn("sluice: sending the local reply: " + err.Error())
	}
	if cap(body) <= maxKeepBytes {
		p.s.body = body[:0]
	} else {
		p.s.bodyOf = replyBodyOf{}
	}
}

// replyBodyOf is what a local reply's body is made of up to its trace id:
// its start (the rule's replyBodyPrefix, by address: those are made once
// per rule and never change), its limit, remaining and reset, and the
// second of its timestamp. ok: the value is set.
type replyBodyOf struct {
	prefix *byte
	v      [3]uint64
	sec    int64
	ok     bool
}

// replyHeadersOf is what a local reply's headers are made of: its four
// numbers (limit, remaining, reset, retry-after) and, with the rate-limit
// headers, the rule reported (whose style, id and window they write; a
// ruleState never changes once configured). ok: the value is set.
type replyHeadersOf struct {
	v    [4]uint64
	rule *ruleState
	ok   bool
}

// replyBodyPrefix is the constant start of a local reply's body, up to
// the value of data.limit: {"code":<status>,"message":"…","data":{"rule":"…","limit":
// (rule "" for the no-policy reply). sendReply appends the rest.
func replyBodyPrefix(status int, message, rule string) []byte {
	w := strictjson.NewWriter(nil)
	w.BeginObject()
	w.AppendKey("code")
	w.AppendInt(int64(status))
	w.AppendKey("message")
	w.AppendString(message)
	w.AppendKey("data")
	w.BeginObject()
	w.AppendKey("rule")
	w.AppendString(rule)
	w.AppendKey("limit")
	return w.Bytes()
}

// noPolicyReplyPrefix starts the 503 body of fail_mode "closed".
var noPolicyReplyPrefix = replyBodyPrefix(503, messageNoPolicy, "")

// appendTimestamp appends now (Unix ns) as RFC 3339 in UTC, whole seconds
// (2026-01-02T03:04:05Z). A flood of denials repeats the same second, so
// the last one formatted is kept.
func (p *pluginContext) appendTimestamp(b []byte, now int64) []byte {
	sec := now / int64(time.Second)
	if sec != p.s.tsSec || len(p.s.ts) == 0 {
		p.s.ts = time.Unix(sec, 0).UTC().AppendFormat(p.s.ts[:0], time.RFC3339)
		p.s.tsSec = sec
	}
	return append(b, p.s.ts...)
}

// replyTextBytes bounds the numbers and fields of a reply's headers: five
// decimal numbers and two structured fields naming a rule id (at most
// rules.MaxIDBytes bytes).
const replyTextBytes = 1024

// appendView appends v in decimal to text and returns text and a view of
// what was appended.
func appendView(text []byte, v uint64) ([]byte, string) {
	start := len(text)
	text = appendUintMember(text, "", v)
	return text, viewString(text[start:])
}

// appendLimitHeaders appends the reported rule's rate-limit headers in its
// policy's style (ruleState.headers):
//
//	x-ratelimit: X-RateLimit-Limit: <limit>, X-RateLimit-Remaining: <remaining>,
//	             X-RateLimit-Reset: <seconds until reset, rounded up>
//	ratelimit:   RateLimit-Policy: "<rule>";q=<limit>;w=<window seconds>
//	             (a bucket: its capacity per its refill time, policyWindowSeconds)
//	             RateLimit: "<rule>";r=<remaining>;t=<seconds until reset>
//
// The second form is draft-ietf-httpapi-ratelimit-headers-09 (§3, §4:
// structured-field lists of named policies with the q, w, r and t
// parameters); w is left out for concurrency rules, which have no window.
func (h *httpContext) appendLimitHeaders(headers [][2]string, text []byte, nums *replyNumbers) ([][2]string, []byte) {
	r := &h.report
	style := r.rule.headers
	if style.XRateLimit() {
		headers = append(headers, [2]string{headerXLimit, nums.limit},
			[2]string{headerXRemaining, nums.remaining}, [2]string{headerXReset, nums.reset})
	}
	if style.IETF() {
		start := len(text)
		text = h.appendPolicyField(text)
		headers = append(headers, [2]string{headerRateLimitPolicy, viewString(text[start:])})
		start = len(text)
		text = h.appendRateLimitField(text)
		headers = append(headers, [2]string{headerRateLimit, viewString(text[start:])})
	}
	return headers, text
}

func (h *httpContext) appendPolicyField(b []byte) []byte {
	r := &h.report
	b = append(b, '"')
	b = append(b, r.rule.cr.ID...)
	b = append(b, `";q=`...)
	b = strconv.AppendUint(b, r.limit, 10)
	if r.rule.windowSeconds > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendUint(b, r.rule.windowSeconds, 10)
	}
	return b
}

func (h *httpContext) appendRateLimitField(b []byte) []byte {
	r := &h.report
	b = append(b, '"')
	b = append(b, r.rule.cr.ID...)
	b = append(b, `";r=`...)
	b = strconv.AppendUint(b, r.remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendUint(b, r.resetSeconds, 10)
}

// traceJSON returns the request's trace id (traceID) as a JSON string, in a
// buffer reused across replies, escaped once for the body and the filter
// state; forState is the same bytes, or nil when the id is empty (the
// filter state then has no trace_id, the body "trace_id":"").
func (p *pluginContext) traceJSON() (body, forState []byte) {
	id := traceID()
	b := strictjson.AppendString(p.s.trace[:0], id)
	if cap(b) <= maxKeepBytes {
		p.s.trace = b[:0]
	}
	if id == "" {
		return b, nil
	}
	return b, b
}

// traceID returns the request's x-request-id (at most maxRequestIDBytes
// bytes), else the trace-id of a valid W3C traceparent header, else "".
func traceID() string {
	if v, err := proxywasm.GetHttpRequestHeader(headerRequestID); err == nil && v != "" && len(v) <= maxRequestIDBytes {
		return v
	}
	if v, err := proxywasm.GetHttpRequestHeader(headerTraceparent); err == nil {
		if id, ok := traceparentID(v); ok {
			return id
		}
	}
	return ""
}

// traceparentID returns the trace-id of a W3C Trace Context traceparent
// value ("00-<32 hex>-<16 hex>-<2 hex>", §3.2 of the Recommendation):
// lower-case hex, version not "ff", trace-id and parent-id not all zeros.
// A future version may append "-..." fields, which are ignored.
func traceparentID(v string) (string, bool) {
	if len(v) < 55 || (len(v) > 55 && (v[0:2] == "00" || v[55] != '-')) {
		return "", false
	}
	if v[2] != '-' || v[35] != '-' || v[52] != '-' || v[0:2] == "ff" {
		return "", false
	}
	if !lowerHex(v[0:2]) || !lowerHex(v[3:35]) || !lowerHex(v[36:52]) || !lowerHex(v[53:55]) {
		return "", false
	}
	if allZero(v[3:35]) || allZero(v[36:52]) {
		return "", false
	}
	return v[3:35], true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
