package host_test

import (
	"context"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

var benchHeaders = host.Headers{
	{":authority", "localhost"}, {":path", "/"}, {":method", "GET"}, {":scheme", "http"},
	{"x-op", "read3"}, {"x-a", "1"}, {"x-b", "2"}, {"x-c", "3"},
}

// BenchmarkRequestHeaders: a plugin that reads three headers and
// continues. headers_only is one proxy_on_request_headers round trip
// through the VM's loop; full_stream adds what a request costs around it
// (context create, on_log, on_done, on_delete).
func BenchmarkRequestHeaders(b *testing.B) {
	h, _ := newHost(b, host.Config{NoCanary: true})
	w := h.Worker(0)
	ctx := context.Background()
	b.Run("headers_only", func(b *testing.B) {
		s, err := w.NewStream(host.StreamInfo{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if st, err := s.RequestHeaders(ctx, benchHeaders, true); err != nil || st != host.Continue {
				b.Fatal(st, err)
			}
		}
		b.StopTimer()
		_ = s.Finish(ctx)
	})
	b.Run("full_stream", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			s, err := w.NewStream(host.StreamInfo{})
			if err != nil {
				b.Fatal(err)
			}
			if st, err := s.RequestHeaders(ctx, benchHeaders, true); err != nil || st != host.Continue {
				b.Fatal(st, err)
			}
			if err := s.Finish(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSharedDataCAS: inside proxy_on_request_headers the guest does
// proxy_get_shared_data and a CAS proxy_set_shared_data of a 1 KiB value
// (the headers round trip is included; compare headers_only above).
func BenchmarkSharedDataCAS(b *testing.B) {
	h, _ := newHost(b, host.Config{NoCanary: true})
	ctx := context.Background()
	s, err := h.Worker(0).NewStream(host.StreamInfo{})
	if err != nil {
		b.Fatal(err)
	}
	hdrs := host.Headers{{":path", "/"}, {":method", "GET"}, {":authority", "x"}, {"x-op", "cas1k"}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.RequestHeaders(ctx, hdrs, true); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if _, cas, ok := h.SharedData("bench"); !ok || cas == 0 {
		b.Fatalf("bench key not written (cas %d)", cas)
	}
	for _, l := range h.Logs() {
		if l.Level == host.LogError {
			b.Fatalf("guest error: %s", l.Message)
		}
	}
}
