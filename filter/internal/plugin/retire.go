package plugin

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Retiring dropped rules.
//
// Envoy cannot delete a shared-data key, but it can overwrite a value with
// an empty one. When a pulled policy drops a rule (removes or renames it),
// its buckets are shrunk to empty, so that rule churn does not grow shared
// data without bound: what stays per dropped rule is its buckets_per_rule
// keys, not their bytes.
//
// Every VM notes the rules its swap dropped (dropRules), and retireTick
// shrinks them retireTicks ticks later, when every worker has applied the
// new policy (workers apply a published policy on their next tick) and so
// no longer writes the dropped buckets. Only one VM per policy version and
// bucket layout does it: the one that first moves the layout's retirement
// mark (retireMarkKey) up to the version by compare-and-swap. A worker that
// still wrote a dropped bucket after that only puts back what one request
// wrote; the shrink itself is a compare-and-swap, so it never erases a
// write it did not see.

// retireTicks is how many ticks after a swap its dropped rules' buckets are
// shrunk.
const retireTicks = 2

// retirement is the dropped rules awaiting retireTick.
type retirement struct {
	policy  string
	version uint64
	ids     []string
	ticks   int
}

// retireMarkKey is the shared-data key of the highest policy version whose
// dropped rules were retired under layout: "sluice/<policy>/retired/<layout>"
// (little-endian u64). It has one segment fewer than a bucket key, so it
// never collides with one.
func retireMarkKey(policy, layout string) string {
	return "sluice/" + policy + "/retired/" + layout
}

// dropRules runs on a swap from prev to c: the rules of prev that c does
// not have (by id, in the same policy) get their metrics flushed and
// forgotten, so that the tick no longer flushes them, and are noted for
// retireTick. A rule noted earlier that c brings back is kept.
func (p *pluginContext) dropRules(prev *policyState, c *rules.Compiled) {
	if prev == nil || prev.compiled.Name != c.Name {
		return
	}
	keep := make(map[string]bool, c.Len())
	for i := 0; i < c.Len(); i++ {
		keep[c.Rule(i).ID] = true
	}
	p.dropRulesKeeping(prev, c.Name, c.Version, keep)
}

// dropRulesKeeping is dropRules for a swap to version of policy name whose rules
// are keep (nil: none, the policy was deleted).
func (p *pluginContext) dropRulesKeeping(prev *policyState, name string, version uint64, keep map[string]bool) {
	var ids []string
	if r := p.retiring; r != nil && r.policy == name {
		for _, id := range r.ids {
			if !keep[id] {
				ids = append(ids, id)
			}
		}
	}
	for i := range prev.rules {
		id := prev.rules[i].cr.ID
		if keep[id] {
			continue
		}
		ids = append(ids, id)
		if m, ok := p.ruleStats[id]; ok {
			m.flush()
			delete(p.ruleStats, id)
		}
	}
	p.retiring = nil
	if len(ids) > 0 {
		p.retiring = &retirement{policy: name, version: version, ids: ids, ticks: retireTicks}
	}
}

// retireTick counts down the pending retirement and, when it is due and
// this VM wins the layout's retirement mark, shrinks the dropped rules'
// buckets to empty by compare-and-swap.
func (p *pluginContext) retireTick() {
	r := p.retiring
	if r == nil {
		return
	}
	if r.ticks > 0 {
		r.ticks--
		return
	}
	p.retiring = nil
	layout := p.layout()
	if !claimRetirement(retireMarkKey(r.policy, layout), r.version) {
		return
	}
	shrunk := 0
	for _, id := range r.ids {
		prefix := bucketKeyPrefix(r.policy, id, layout)
		for n := 0; n < p.cfg.BucketsPerRule; n++ {
			key := prefix + strconv.Itoa(n)
			v, cas, err := proxywasm.GetSharedData(key)
			if err != nil || len(v) == 0 {
				continue
			}
			if err := proxywasm.SetSharedData(key, nil, cas); err != nil {
				proxywasm.LogDebug("sluice: retiring " + key + ": " + err.Error())
				continue
			}
			shrunk++
		}
	}
	proxywasm.LogInfo("sluice: policy " + r.policy + " version " + strconv.FormatUint(r.version, 10) + ": retired the counters of " +
		strconv.Itoa(len(r.ids)) + " dropped rules (" + strconv.Itoa(shrunk) + " buckets emptied)")
}

// claimRetirement moves the retirement mark at key up to version by
// compare-and-swap; false if it already is at version or above, or another
// VM moved it first. An absent mark is created with the cas of the hash key
// as witness (no write to the mark can have had it), so that two VMs
// creating it at once cannot both win.
func claimRetirement(key string, version uint64) bool {
	v, cas, err := proxywasm.GetSharedData(key)
	switch {
	case errors.Is(err, proxywasm.ErrNotFound):
		cas = casAbsent
		if _, witness, err := proxywasm.GetSharedData(hashKeyKey); err == nil {
			cas = witness
		}
	case err != nil:
		return false
	case len(v) == 8 && binary.LittleEndian.Uint64(v) >= version:
		return false
	}
	return proxywasm.SetSharedData(key, binary.LittleEndian.AppendUint64(nil, version), cas) == nil
}
