package plugin

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// bucketKeyPrefix is the shared-data key of a rule's buckets under a layout
// (layoutName) up to the bucket number: bucket n's key is
// "sluice/<policy>/<rule id>/<layout>/<n>", the prefix followed by n in
// decimal (a loop over a rule's buckets builds the prefix once). It holds
// no version, so a rule that keeps its id and definition keeps its counters
// across policy versions. It holds the layout, so two plugin configurations
// that share a vm_id and a policy but not entries_per_bucket or
// buckets_per_rule (e.g. an old one still draining after a configuration
// change) keep separate counters: neither reads the other's buckets as
// corrupt and wipes them, and a client key maps to one bucket per
// configuration, never to a bucket shared by chance.
func bucketKeyPrefix(policy, rule, layout string) string {
	return "sluice/" + policy + "/" + rule + "/" + layout + "/"
}

// layoutName names a bucket layout in bucket keys:
// "e<entries_per_bucket>b<buckets_per_rule>", e.g. "e16b64".
func layoutName(entriesPerBucket, bucketsPerRule int) string {
	return "e" + strconv.Itoa(entriesPerBucket) + "b" + strconv.Itoa(bucketsPerRule)
}

// layout returns the name of the configured bucket layout.
func (p *pluginContext) layout() string {
	return layoutName(p.cfg.EntriesPerBucket, p.cfg.BucketsPerRule)
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
// The creating write carries the cas of another key read just before (a
// witness; casAbsent if none was found): no write to the key being created
// can have had that cas, since every write takes the next value of one
// global counter, so if another VM created the key and a request wrote it
// meanwhile, the write fails with CAS_MISMATCH instead of erasing that
// charge, as a cas-0 write would.
//
// It returns the first shared-data error other than NOT_FOUND and
// CAS_MISMATCH.
func (p *pluginContext) createBuckets(c *rules.Compiled) error {
	layout := p.layout()
	witness := casAbsent
	if _, cas, err := proxywasm.GetSharedData(hashKeyKey); err == nil {
		witness = cas
	}
	for i := 0; i < c.Len(); i++ {
		prefix := bucketKeyPrefix(c.Name, c.Rule(i).ID, layout)
		for n := 0; n < p.cfg.BucketsPerRule; n++ {
			key := prefix + strconv.Itoa(n)
			_, cas, err := proxywasm.GetSharedData(key)
			switch {
			case err == nil:
				witness = cas
				continue
			case !errors.Is(err, proxywasm.ErrNotFound):
				return errors.New("reading " + key + ": " + err.Error())
			}
			if err := proxywasm.SetSharedData(key, nil, witness); err != nil && !errors.Is(err, proxywasm.ErrCasMismatch) {
				return errors.New("creating " + key + ": " + err.Error())
			}
		}
	}
	return p.createLeaseBuckets(c)
}

// countOverflow counts a decision of rule rs made against a bucket's overflow
// state (every entry of the bucket was live): plugin-wide and per rule, so
// that an undersized table shows (see table's full-bucket policy).
func (p *pluginContext) countOverflow(rs *ruleState) {
	p.m.overflow.Increment(1)
	rs.m.overflow.Increment(1)
}
