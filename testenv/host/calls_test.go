package host_test

import (
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestImportCalls: the counts are per import name, summed over the VMs,
// and start again from zero after ResetImportCalls.
func TestImportCalls(t *testing.T) {
	h, _ := newHost(t, host.Config{Workers: 2})
	// The Go runtime reads the WASI clock while it starts (canary and
	// both workers), before any request.
	if got := h.ImportCalls()["clock_time_get"]; got == 0 {
		t.Errorf("clock_time_get after start = 0, want > 0 (counts %v)", h.ImportCalls())
	}
	// Warm both workers so that one-time work (metric definitions, GC
	// growth) is behind the counted requests.
	for i := 0; i < 2; i++ {
		for w := 0; w < 2; w++ {
			do(t, h.Worker(w), host.Request{Headers: op("read3")})
		}
	}
	h.ResetImportCalls()
	if got := h.ImportCalls(); len(got) != 0 {
		t.Fatalf("after ResetImportCalls: %v, want none", got)
	}

	// read3 on each worker: x-op then x-a, x-b, x-c, and the requests
	// counter's increment. cas1k on worker 1: one shared-data read and
	// one write. reply: one local response and one log line.
	const n = 3
	for i := 0; i < n; i++ {
		do(t, h.Worker(0), host.Request{Headers: op("read3")})
		do(t, h.Worker(1), host.Request{Headers: op("read3")})
	}
	do(t, h.Worker(1), host.Request{Headers: op("cas1k")})
	do(t, h.Worker(0), host.Request{Headers: op("reply")})
	got := h.ImportCalls()
	t.Logf("import calls: %v", got)
	const reqs = 2*n + 2
	for name, want := range map[string]uint64{
		"proxy_get_header_map_value": 2*n*4 + 2, // cas1k and reply read x-op only
		"proxy_increment_metric":     reqs,
		"proxy_get_shared_data":      1,
		"proxy_set_shared_data":      1,
		"proxy_send_local_response":  1,
		"proxy_set_property":         0,
		"proc_exit":                  0,
	} {
		if got[name] != want {
			t.Errorf("%s: %d calls, want %d", name, got[name], want)
		}
	}
	if got["proxy_log"] < 1 {
		t.Errorf("proxy_log: %d calls, want ≥ 1 (reply logs)", got["proxy_log"])
	}

	h.ResetImportCalls()
	do(t, h.Worker(0), host.Request{Headers: op("read3")})
	if got := h.ImportCalls()["proxy_get_header_map_value"]; got != 4 {
		t.Errorf("after a second reset, one read3 request: proxy_get_header_map_value %d calls, want 4", got)
	}
}
