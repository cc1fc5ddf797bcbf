package host

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// calloutResult is what proxy_on_http_call_response may read: map 6, map
// 7 and buffer 4, set only for the duration of that callback.
type calloutResult struct {
	headers, trailers Headers
	body              []byte
	failed            bool
}

func hostHTTPCall(v *vm, s []uint64) status {
	cluster, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	hraw, ok2 := v.read(uint32(s[2]), uint32(s[3]))
	body, ok3 := v.read(uint32(s[4]), uint32(s[5]))
	traw, ok4 := v.read(uint32(s[6]), uint32(s[7]))
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return statusInvalidMemoryAccess
	}
	hdrs, ok5 := decodePairs(hraw)
	trls, ok6 := decodePairs(traw)
	if !ok5 || !ok6 {
		return statusBadArgument
	}
	body = append([]byte(nil), body...)
	timeoutMS := int32(uint32(s[8]))
	// ENVOY-CTX Context::httpCall: negative timeout, unknown cluster or a
	// missing :path, :method or :authority is BAD_ARGUMENT, synchronously.
	if timeoutMS < 0 {
		return statusBadArgument
	}
	addr, known := v.h.cfg.Clusters[cluster]
	if !known {
		return statusBadArgument
	}
	var h Headers
	for _, kv := range hdrs {
		h = h.add(strings.ToLower(kv[0]), kv[1])
	}
	for _, p := range []string{":path", ":method", ":authority"} {
		if _, ok := h.Lookup(p); !ok {
			return statusBadArgument
		}
	}
	// The call belongs to the root context (contextOrEffectiveContext()->
	// root_context()); tokens count from 1 per root context, skipping 0
	// and tokens in use.
	tok := v.nextCallToken
	for tok == 0 || hasCall(v, tok) {
		tok++
	}
	v.nextCallToken = tok + 1
	if !v.writeU32(uint32(s[9]), tok) {
		return statusInvalidMemoryAccess
	}
	v.calls[tok] = struct{}{}
	var timeout time.Duration // 0: no timeout (absl::nullopt)
	if timeoutMS > 0 {
		timeout = time.Duration(timeoutMS) * time.Millisecond
	}
	v.h.pending.Add(1)
	if v.h.cfg.InlineCallouts {
		res := v.h.doCallout(cluster, addr, h, body, Headers(trls), timeout)
		v.inlineCalls++
		if !v.post(func() { defer v.h.pending.Done(); v.inlineCalls--; v.deliverCallout(tok, res) }) {
			v.h.pending.Done()
		}
		return statusOK
	}
	v.h.callWG.Add(1)
	go func() {
		defer v.h.callWG.Done()
		res := v.h.doCallout(cluster, addr, h, body, Headers(trls), timeout)
		// Delivered on the VM's loop, outside any other VM call.
		if !v.post(func() { defer v.h.pending.Done(); v.deliverCallout(tok, res) }) {
			v.h.pending.Done()
		}
	}()
	return statusOK
}

func hasCall(v *vm, tok uint32) bool { _, ok := v.calls[tok]; return ok }

func (v *vm) deliverCallout(tok uint32, res *calloutResult) {
	delete(v.calls, tok)
	if v.failed != nil {
		return
	}
	v.callout = res
	if res.failed {
		// ENVOY-CTX onHttpCallFailure: (0, 0, 0) and get_status gives
		// (BrokenConnection, "reset").
		v.status.code, v.status.msg = uint32(statusBrokenConnection), "reset"
		_, _ = v.callback("proxy_on_http_call_response", uint64(v.rootID), uint64(tok), 0, 0, 0)
	} else {
		v.status.code, v.status.msg = uint32(statusOK), ""
		_, _ = v.callback("proxy_on_http_call_response", uint64(v.rootID), uint64(tok),
			uint64(len(res.headers)), uint64(len(res.body)), uint64(len(res.trailers)))
	}
	v.callout = nil
	v.status.code, v.status.msg = 0, ""
}

// doCallout performs the request with net/http against addr. Following
// Envoy's async client and router:
//   - no response headers (connection refused, reset before headers) →
//     a 503 local reply delivered as a success, body "upstream connect
//     error or disconnect/reset before headers. reset reason: …";
//   - the call's timeout → 504 "upstream request timeout", delivered as a
//     success [UNCONFIRMED: from issue reports; docs/ENVOY.md, HTTP calls];
//   - a reset after the headers (body cut short) → failure: (0, 0, 0)
//     and proxy_get_status (11, "reset"), ENVOY-CTX onHttpCallFailure.
func (h *Host) doCallout(cluster, addr string, hdrs Headers, body []byte, trailers Headers, timeout time.Duration) *calloutResult {
	ctx := h.callCtx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	scheme, client := "http", h.client
	if c, ok := h.tlsClients[cluster]; ok {
		scheme, client = "https", c
	}
	url := scheme + "://" + addr + hdrs.Get(":path")
	req, err := http.NewRequestWithContext(ctx, hdrs.Get(":method"), url, bytes.NewReader(body))
	if err != nil {
		return localCalloutReply(503, "upstream connect error or disconnect/reset before headers. reset reason: protocol error")
	}
	req.Host = hdrs.Get(":authority")
	for _, kv := range hdrs {
		if !strings.HasPrefix(kv[0], ":") {
			req.Header.Add(kv[0], kv[1])
		}
	}
	if len(body) > 0 {
		req.ContentLength = int64(len(body)) // Envoy sets content-length
	}
	if len(trailers) > 0 {
		req.Trailer = http.Header{}
		for _, kv := range trailers {
			req.Trailer.Add(kv[0], kv[1])
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return localCalloutReply(504, "upstream request timeout")
		}
		if h.callCtx.Err() != nil {
			return &calloutResult{failed: true}
		}
		return localCalloutReply(503, "upstream connect error or disconnect/reset before headers. reset reason: connection failure")
	}
	defer resp.Body.Close()
	rbody, err := io.ReadAll(resp.Body)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return localCalloutReply(504, "upstream request timeout")
		}
		return &calloutResult{failed: true}
	}
	res := &calloutResult{body: rbody}
	res.headers = Headers{{":status", strconv.Itoa(resp.StatusCode)}}
	for _, k := range sortedKeys(resp.Header) {
		for _, val := range resp.Header[k] {
			res.headers = append(res.headers, [2]string{strings.ToLower(k), val})
		}
	}
	if len(resp.Header.Values("Content-Length")) == 0 && resp.ContentLength >= 0 {
		res.headers = append(res.headers, [2]string{"content-length", strconv.FormatInt(resp.ContentLength, 10)})
	}
	for _, k := range sortedKeys(resp.Trailer) {
		for _, val := range resp.Trailer[k] {
			res.trailers = append(res.trailers, [2]string{strings.ToLower(k), val})
		}
	}
	return res
}

func localCalloutReply(code int, body string) *calloutResult {
	return &calloutResult{
		headers: Headers{{":status", strconv.Itoa(code)}, {"content-length", strconv.Itoa(len(body))}, {"content-type", "text/plain"}},
		body:    []byte(body),
	}
}

func sortedKeys(h http.Header) []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}
