package plugin

import (
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/policysync"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// startSync starts pulling the policy from the control plane when the
// configuration has a "control_plane" section (filter/internal/policysync):
// a pulled policy replaces the static one through swapPolicy, vetted
// against the bucket layout first, and wins over it from then on. It runs
// after the static policy is installed, so that a policy already published
// in shared data (by another worker) takes over at once.
func (p *pluginContext) startSync() error {
	cp := p.cfg.ControlPlane
	if !cp.Enabled {
		return nil
	}
	s, err := policysync.New(policysync.Options{
		Policy: cp.Policy, Cluster: cp.Cluster, Authority: cp.Authority, Token: cp.Token,
		Wait: cp.Wait, Timeout: cp.Timeout, Tick: p.cfg.Tick, Lease: cp.Lease,
		Compile: rules.CompileOptions{Env: p.cfg.Env},
		Check:   func(c *rules.Compiled) error { return p.cfg.CheckPolicy(c, "policy") },
		Prepare: p.createBuckets,
		Apply:   p.swapPolicy,
		// The host's clock in one hostcall, the clock the request path
		// passes to Check (time.Now would make two WASI calls).
		Now: func() time.Time { return time.Unix(0, clockNow()) },
	})
	if err != nil {
		return err
	}
	p.sync = s
	s.Start()
	return nil
}
