package main

import (
	"bytes"
	"context"
	"maps"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestBodyChunksDoNotEnterTheFilter: an allowed POST with 8 body chunks each
// way enters the module through the same callbacks, and makes the same
// hostcalls, as a request without a body, and both bodies reach their
// destination byte for byte. The filter decides on headers alone, so the
// module exports no body callback and the host answers each chunk Continue
// without calling into Go.
func TestBodyChunksDoNotEnterTheFilter(t *testing.T) {
	h, err := host.New(context.Background(), host.Config{
		Wasm: buildWasmTB(t), VMID: "sluice", PluginName: "sluice", NoCanary: true,
		PluginConfig: []byte(`{"tick":"1m","policy":` + benchPolicy(benchRule) + `}`),
		Clock:        host.NewVirtualClock(epoch), LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	w := h.Worker(0)
	ctx := context.Background()
	info := host.StreamInfo{SourceAddress: "203.0.113.7:40000"}
	headers := host.Headers{{":method", "POST"}, {":path", "/v1/api/items"}, {":authority", "test"}, {"x-user-id", "u"}, {"x-tenant-id", "acme"}}
	respHeaders := host.Headers{{":status", "200"}}

	// stream sends one full stream; chunks 0 means no body either way.
	stream := func(chunks int) (reqBody, respBody []byte) {
		t.Helper()
		s, err := w.NewStream(info)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := s.RequestHeaders(ctx, headers, chunks == 0); err != nil || st != host.Continue {
			t.Fatalf("request headers: %v, %v; want Continue", st, err)
		}
		for k := range chunks {
			chunk := bytes.Repeat([]byte{byte('a' + k)}, 1024)
			reqBody = append(reqBody, chunk...)
			if st, err := s.RequestBody(ctx, chunk, k == chunks-1); err != nil || st != host.Continue {
				t.Fatalf("request body chunk %d: %v, %v; want Continue", k, st, err)
			}
		}
		if st, err := s.ResponseHeaders(ctx, respHeaders, chunks == 0); err != nil || st != host.Continue {
			t.Fatalf("response headers: %v, %v; want Continue", st, err)
		}
		for k := range chunks {
			chunk := bytes.Repeat([]byte{byte('A' + k)}, 1024)
			respBody = append(respBody, chunk...)
			if st, err := s.ResponseBody(ctx, chunk, k == chunks-1); err != nil || st != host.Continue {
				t.Fatalf("response body chunk %d: %v, %v; want Continue", k, st, err)
			}
		}
		if got := s.ForwardedRequestBody(); !bytes.Equal(got, reqBody) {
			t.Errorf("request body forwarded: %d bytes, want the %d sent unchanged", len(got), len(reqBody))
		}
		if got := s.ForwardedResponseBody(); !bytes.Equal(got, respBody) {
			t.Errorf("response body forwarded: %d bytes, want the %d sent unchanged", len(got), len(respBody))
		}
		if err := s.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		return reqBody, respBody
	}

	for range 3 { // warm: key creation and first allocations behind
		stream(0)
	}
	h.ResetImportCalls()
	stream(0)
	wantEntries, wantCalls := h.CallbackCalls(), h.ImportCalls()
	if wantEntries["proxy_on_request_headers"] != 1 || wantEntries["proxy_on_response_headers"] != 1 {
		t.Fatalf("a bodiless stream entered the module %v; want one request and one response headers callback", wantEntries)
	}
	h.ResetImportCalls()
	stream(8)
	if got := h.CallbackCalls(); !maps.Equal(got, wantEntries) {
		t.Errorf("callbacks entered for a stream with 8 body chunks each way: %v; without a body: %v", got, wantEntries)
	}
	if got := h.ImportCalls(); !maps.Equal(got, wantCalls) {
		t.Errorf("hostcalls for a stream with 8 body chunks each way: %v; without a body: %v", got, wantCalls)
	}
}
