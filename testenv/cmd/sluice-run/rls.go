package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// startRLSEnvoy applies RLS_POLICY as policy "edge" unless one is stored,
// writes the bootstrap sluicectl envoy-config rls makes for it (RUN_DIR/envoy-rls.yaml:
// Envoy's ratelimit filter asking the control plane's RateLimitService on grpc,
// the quota token in its metadata) on make run's ports, starts that Envoy and
// waits until it is ready.
func startRLSEnvoy(ctx context.Context, s settings, sup *supervisor, cp, grpc, up string, tokens []string) error {
	doc, err := os.ReadFile(s.rlsPolicy)
	if err != nil {
		return fmt.Errorf("the RateLimitService demo policy: %w", err)
	}
	version, created, err := applyDemo(ctx, cp, s.admin, "edge", doc)
	if err != nil {
		return err
	}
	if created {
		step("applied %s as policy \"edge\" (version %d), served by the RateLimitService on %s", s.rlsPolicy, version, grpc)
	} else {
		step("keeping the stored policy \"edge\" (version %d), served by the RateLimitService on %s", version, grpc)
	}
	listen, admin := "127.0.0.1:"+s.rlsPort, "127.0.0.1:"+s.rlsAdminPort
	cfg := filepath.Join(s.runDir, "envoy-rls.yaml")
	gen := exec.CommandContext(ctx, filepath.Join(s.binDir, "sluicectl"), "envoy-config", "rls", "--policy", "edge",
		"--grpc", grpc, "--upstream", up, "--listen", listen, "--admin", admin)
	gen.Env = append(os.Environ(), append(tokens, "SLUICE_SERVER=http://"+cp)...)
	out, err := gen.Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + string(ee.Stderr)
		}
		return fmt.Errorf("sluicectl envoy-config rls: %s", msg)
	}
	if err := os.WriteFile(cfg, out, 0o644); err != nil {
		return err
	}
	step("starting %s with Envoy's ratelimit filter on http://%s (%s)", s.proxy.the(), listen, cfg)
	if err := sup.start(s, "envoy-rls", s.proxy.envoyBin, []string{"-c", cfg, "--concurrency", s.workers, "--use-dynamic-base-id",
		"--file-flush-min-size-kb", "0", "--log-level", "warn"}, nil); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+admin+"/ready", 60*time.Second, sup); err != nil {
		return fmt.Errorf("the ratelimit-filter Envoy is not ready: %w (see %s)", err, filepath.Join(s.runDir, "envoy-rls.log"))
	}
	return nil
}
