package plugin

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// bucketKey is the shared-data key of bucket n of a rule:
// "sluice/<policy>/<rule id>/<n>". It holds no version, so a rule that keeps
// its id and definition keeps its counters across policy versions.
func bucketKey(policy, rule string, n int) string {
	return "sluice/" + policy + "/" + rule + "/" + strconv.Itoa(n)
}

// createBuckets makes every bucket key of c exist before any request uses
// it, by writing an empty value (read as an empty table) to each absent key.
//
// Why: Envoy's shared data cannot create a key atomically. A write to an
// absent key succeeds whatever cas it carries (proxy-wasm-cpp-host
// SharedData::set), so two workers that both read NOT_FOUND for a bucket
// would both "win" their CAS write, and one charge would be lost (two
// requests admitted into one concurrency slot). Once the key exists, every
// write is a real compare-and-swap. So the keys are created where no
// request can race them: by the canary VM at configure for the static
// policy (Envoy runs it before any worker), and by the sync lease holder
// before it publishes a pulled policy (workers see the policy only after).
// A worker that still finds a key absent falls back to casAbsent.
//
// It returns the first shared-data error other than NOT_FOUND.
func (p *pluginContext) createBuckets(c *rules.Compiled) error {
	for i := 0; i < c.Len(); i++ {
		id := c.Rule(i).ID
		for n := 0; n < p.cfg.BucketsPerRule; n++ {
			key := bucketKey(c.Name, id, n)
			_, _, err := proxywasm.GetSharedData(key)
			switch {
			case err == nil:
				continue
			case !errors.Is(err, proxywasm.ErrNotFound):
				return errors.New("reading " + key + ": " + err.Error())
			}
			if err := proxywasm.SetSharedData(key, nil, 0); err != nil {
				return errors.New("creating " + key + ": " + err.Error())
			}
		}
	}
	return nil
}

// countOverflow counts a decision of rule rs made against a bucket's overflow
// state (every entry of the bucket was live): plugin-wide and per rule, so
// that an undersized table shows (see table's full-bucket policy).
func (p *pluginContext) countOverflow(rs *ruleState) {
	p.m.overflow.Increment(1)
	rs.m.overflow.Increment(1)
}
