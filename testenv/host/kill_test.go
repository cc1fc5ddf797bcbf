package host_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

func TestKillStopsOneWorker(t *testing.T) {
	h, clock := newHost(t, host.Config{PluginConfig: []byte("tick=100"), Workers: 2})
	ticks := func(worker int) int {
		n := 0
		for _, l := range h.Logs() {
			if l.Worker == worker && strings.HasPrefix(l.Message, "tick ") {
				n++
			}
		}
		return n
	}
	clock.Advance(100 * time.Millisecond)
	if a, b := ticks(0), ticks(1); a != 1 || b != 1 {
		t.Fatalf("ticks after one period: %d, %d; want 1 each", a, b)
	}
	h.Worker(0).Kill()
	h.Worker(0).Kill() // idempotent
	clock.Advance(300 * time.Millisecond)
	if a, b := ticks(0), ticks(1); a != 1 || b != 4 {
		t.Errorf("ticks after three more periods: %d, %d; want 1 (killed), 4", a, b)
	}
	if _, err := h.Worker(0).Do(context.Background(), host.Request{}); !errors.Is(err, host.ErrKilled) || !errors.Is(err, host.ErrVMFailed) {
		t.Errorf("Do on a killed worker: %v, want ErrKilled (matching ErrVMFailed)", err)
	}
	if err := h.Worker(0).Failed(); !errors.Is(err, host.ErrKilled) {
		t.Errorf("Failed() = %v", err)
	}
	if _, err := h.Worker(1).Do(context.Background(), host.Request{}); err != nil {
		t.Errorf("the live worker: %v", err)
	}
}
