package plugin

// Requests that arrive before the first policy: held, paused, until a tick
// finds one in use, or until control_plane.first_policy_wait has passed since
// the plugin started; then decided as any request (by the policy, or by
// fail_mode).

import (
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// maxHeldForPolicy bounds the requests a worker holds for the first policy;
// one more is decided by fail_mode at once.
const maxHeldForPolicy = 4096

// heldRequest is a request held for the first policy: its stream (matched by
// seq, since contexts are reused) and context id.
type heldRequest struct {
	h   *httpContext
	seq uint64
	id  uint32
}

// firstPolicy is a worker's hold of requests before the first policy.
type firstPolicy struct {
	// until is when holding ends, Unix ns: the plugin's start plus
	// first_policy_wait; 0 once a policy is in use (or without a control
	// plane, or first_policy_wait 0s): nothing is held then.
	until int64
	held  []heldRequest
	seq   uint64
}

// startFirstPolicyHold begins holding requests until the first policy, when
// the plugin has none yet and pulls one from the control plane.
func (p *pluginContext) startFirstPolicyHold() {
	cp := p.cfg.ControlPlane
	if p.pol == nil && cp.Enabled && cp.FirstPolicyWait > 0 {
		p.first.until = clockNow() + int64(cp.FirstPolicyWait)
	}
}

// holdForPolicy holds the request (it returns true: the caller pauses it)
// while the worker has no policy and first_policy_wait has not passed.
func (h *httpContext) holdForPolicy() bool {
	p := h.p
	f := &p.first
	if f.until == 0 || len(f.held) >= maxHeldForPolicy || clockNow() >= f.until {
		return false
	}
	f.seq++
	h.heldSeq = f.seq
	f.held = append(f.held, heldRequest{h: h, seq: f.seq, id: h.fq.id})
	p.m.heldForPolicy.Increment(1)
	return true
}

// firstPolicyTick, on each tick, ends the hold once a policy is in use or
// first_policy_wait has passed: every held request is decided afresh with its
// stream as the effective context (by the policy, or by fail_mode), then
// resumed or answered. A request whose stream ended meanwhile is skipped.
func (p *pluginContext) firstPolicyTick() {
	f := &p.first
	if f.until == 0 || (p.pol == nil && clockNow() < f.until) {
		return
	}
	f.until = 0
	held := f.held
	f.held = nil
	for _, w := range held {
		h := w.h
		if h.heldSeq != w.seq {
			continue
		}
		h.heldSeq = 0
		if err := proxywasm.SetEffectiveContext(w.id); err != nil {
			continue
		}
		if h.OnHttpRequestHeaders(0, false) == types.ActionContinue {
			if err := proxywasm.ResumeHttpRequest(); err != nil {
				proxywasm.LogDebug("sluice: resuming a request held for the first policy: " + err.Error())
			}
		}
	}
}
