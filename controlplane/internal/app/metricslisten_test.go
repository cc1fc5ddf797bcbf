package app

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestMetricsListenServesPlainMetricsBesideTLS: with --metrics-listen, a control
// plane whose API is HTTPS with client certificates (the mTLS install) also serves
// /metrics, /healthz and /readyz over plain HTTP on that address, so Prometheus
// scrapes it in either mode; nothing else is served there.
func TestMetricsListenServesPlainMetricsBesideTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	startTLSPlane(t, doc, "--metrics-listen", addr)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "sluice_controlplane_") {
		t.Fatalf("GET /metrics on the metrics listener: %d %.200s", code, body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := get(p); code != 200 {
			t.Errorf("GET %s on the metrics listener: %d %s", p, code, body)
		}
	}
	if code, _ := get("/v1/policies/p"); code != http.StatusNotFound {
		t.Errorf("GET /v1/policies/p on the metrics listener: %d, want 404 (the API is not served there)", code)
	}
}
