package host_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// TestSurvivesManyGCsUnderENOSYS: the os-free plugin allocates 64 KiB and
// forces a GC on each of 2000 requests under the default (pre-PR #533,
// ENOSYS poll_oneoff) profile.
func TestSurvivesManyGCsUnderENOSYS(t *testing.T) {
	h, _ := newHost(t, host.Config{NoCanary: true})
	w := h.Worker(0)
	for i := 0; i < 2000; i++ {
		resp, err := w.Do(context.Background(), host.Request{Headers: op("gc")})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.Upstream == nil {
			t.Fatalf("request %d did not pass", i)
		}
	}
}

// TestProfileBites: the os-importing twin crashes at its first GC under
// the ENOSYS profile (golang/go#78513) and runs under EnvoyPostPR533.
func TestProfileBites(t *testing.T) {
	run := func(p host.Profile) error {
		h, err := host.New(context.Background(), host.Config{Wasm: osWasm, Profile: p, NoCanary: true, Clock: host.NewVirtualClock(epoch)})
		if err != nil {
			return err
		}
		defer h.Close()
		for i := 0; i < 50; i++ {
			if _, err := h.Worker(0).Do(context.Background(), host.Request{}); err != nil {
				logs := h.Logs()
				var msgs []string
				for _, l := range logs {
					msgs = append(msgs, l.Message)
				}
				return fmt.Errorf("%w\nlogs: %s", err, strings.Join(msgs, ""))
			}
		}
		return nil
	}
	err := run(host.EnvoyPrePR533)
	if !errors.Is(err, host.ErrVMFailed) || !strings.Contains(err.Error(), "poll_oneoff") {
		t.Errorf("pre-PR533: err = %v, want a VM failure mentioning poll_oneoff", err)
	}
	if err := run(host.EnvoyPostPR533); err != nil {
		t.Errorf("post-PR533: %v", err)
	}
}
