package plugin

import (
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

// OnHttpStreamDone releases the concurrency slots the request acquired.
// filter/proxywasm calls it exactly once per stream, from proxy_on_delete,
// which ends every stream (also one reset before a response). A release that fails (CAS retries exhausted) is left to the
// rule's lease, which reclaims the slot.
func (h *httpContext) OnHttpStreamDone() {
	p := h.p
	proxywasm.BeginHostScratch() // nothing read here outlives the callback
	h.fleetStreamDone()
	h.heldSeq = 0
	if len(h.charges) > 0 {
		now := clockNow()
		for i := range h.charges {
			c := &h.charges[i]
			if !c.rule.concurrency {
				continue
			}
			if !p.undo(c.rule, c.bucket, c.hash, c.cost, c.acquiredAt, now) {
				proxywasm.LogDebug("sluice: rule " + c.rule.cr.ID + ": concurrency release failed; the lease will reclaim the slot")
			}
		}
	}
	p.recycle(h)
}

func appendUint(b []byte, v uint64) []byte { return strconv.AppendUint(b, v, 10) }
