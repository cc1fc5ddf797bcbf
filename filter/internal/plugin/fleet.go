package plugin

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/internal/fleetclient"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// fleetMode is how a rule is enforced: per Envoy (fleetNone) or from leases,
// degrading as on_quota_failure says.
type fleetMode uint8

const (
	fleetNone fleetMode = iota
	fleetLocal
	fleetPass
	fleetDeny
)

// Fleet constants.
const (
	// maxQuotaRounds bounds how often one request waits for quota; a request
	// that waited that often (other requests took the units granted meanwhile)
	// is decided as on_quota_failure says.
	maxQuotaRounds = 3
	// maxQuotaAnswerBytes bounds the quota service's answer.
	maxQuotaAnswerBytes = 1 << 20
	// reasonQuotaUnavailable is the filter state reason when a fleet rule degraded.
	reasonQuotaUnavailable = "quota_unavailable"
	quotaPath              = "/v1/quota"
)

// The quota field of a fleet rule's filter state.
const (
	quotaLocal    = "local"
	quotaWaited   = "waited"
	quotaDegraded = "degraded"
)

// fleetRule is a ruleState's fleet part.
type fleetRule struct {
	mode      fleetMode
	leaseKeys []string
	// statusKey is the shared-data key of what the quota service last said
	// of its keys (fleetclient.Rule.StatusKey).
	statusKey string
	// limit is the limit its decisions report (X-RateLimit-Limit,
	// RateLimit-Policy's q): what the rule's limiter reports per Envoy, a
	// bucket's capacity (with RateLimit-Policy's w its refill time) or the
	// window's limit, so that both scopes tell a client the same pace.
	limit uint64
}

// fleetEval is an eval's fleet part.
type fleetEval struct {
	lease    bool // decided from the lease: commit writes entry to the lease bucket
	skip     bool // nothing to write (pass, or a shadow rule without quota)
	pending  bool // no quota: the request waits for the service
	degraded bool // decided by on_quota_failure
	// charge is the units a degraded "local" or "pass" decision admits
	// without a lease: once the request is admitted they become the lease
	// entry's charge (chargeUnleased).
	charge uint64
	read   bool // readDecideFleet ran for this eval
	entry  fleet.Entry
}

// fleetReq is an httpContext's fleet part: the request's own state of its
// waits for quota.
type fleetReq struct {
	id     uint32 // the stream's context id
	seq    uint64 // non-zero while waiting: matches the waiter entries
	rounds int    // quota rounds waited
	waited bool
}

// fleetWorker is a worker's fleet state: its quota client and the waits.
type fleetWorker struct {
	client *fleetclient.Client
	seq    uint64
	m      fleetMetrics
}

type fleetMetrics struct {
	calls, failures, badAnswers, waits, degraded, refused, retried, unapplied, evictions counter
}

func (m *fleetMetrics) define() {
	m.calls.m, _ = proxywasm.DefineCounterMetric("sluice.quota.calls")
	m.failures.m, _ = proxywasm.DefineCounterMetric("sluice.quota.failures")
	m.badAnswers.m, _ = proxywasm.DefineCounterMetric("sluice.quota.bad_answers")
	m.waits.m, _ = proxywasm.DefineCounterMetric("sluice.quota.waits")
	m.degraded.m, _ = proxywasm.DefineCounterMetric("sluice.quota.degraded")
	m.refused.m, _ = proxywasm.DefineCounterMetric("sluice.quota.refused_keys")
	m.retried.m, _ = proxywasm.DefineCounterMetric("sluice.quota.retried_keys")
	m.unapplied.m, _ = proxywasm.DefineCounterMetric("sluice.quota.unapplied_grants")
	m.evictions.m, _ = proxywasm.DefineCounterMetric("sluice.quota.lease_evictions")
}

func (m *fleetMetrics) flush() {
	for _, c := range [...]*counter{&m.calls, &m.failures, &m.badAnswers, &m.waits, &m.degraded, &m.refused, &m.retried, &m.unapplied, &m.evictions} {
		c.flush()
	}
}

// fleetStart defines the fleet metrics, makes the quota client (keeping the
// one of an earlier configuration, with its keys and calls) and picks the
// Envoy id.
func (p *pluginContext) fleetStart() {
	p.fleet.m.define()
	cp := p.cfg.ControlPlane
	cfg := fleetclient.Config{Interval: cp.QuotaInterval, Timeout: cp.QuotaTimeout, Tick: p.cfg.Tick,
		EntriesPerBucket: p.cfg.EntriesPerBucket, CASRetries: p.cfg.CASRetries}
	if p.fleet.client == nil {
		m := &p.fleet.m
		p.fleet.client = fleetclient.New(quotaHost{p}, cfg, fleetclient.Metrics{
			Calls: &m.calls, Failures: &m.failures, BadAnswers: &m.badAnswers, Refused: &m.refused,
			Retried: &m.retried, Unapplied: &m.unapplied, Evictions: &m.evictions,
			CASRetries: &p.m.casRetries, CASExhausted: &p.m.casExhausted})
		p.fleet.client.Resume = p.resumeWaiters
		p.fleet.client.Policy = p.fleetPolicy
	} else {
		p.fleet.client.SetConfig(cfg)
	}
	if cp.Envoy != "" {
		p.fleet.client.Envoy = cp.Envoy
		return
	}
	if p.hashKeyOK {
		p.fleet.client.Envoy = envoyID(p.hashKey)
	} // else set on the first quota call after the hash key is read
}

// envoyID is this Envoy's id for the quota service when the configuration
// names none: "<node id>~<16 hex digits>", or "sluice-<16 hex digits>" without
// a usable node id. The digits come from the per-Envoy hash key in shared data,
// so every worker of one Envoy has the same id and two Envoys never do, even
// when a static bootstrap gives every replica the same node.id: the quota
// service keeps one ledger of leases per id, and two Envoys sharing one would
// spend and return each other's units. The node id (Envoy >= 1.33 serves it
// as xds.node.id; older releases as node.id) keeps the id readable.
func envoyID(hashKey siphash.Key) string {
	suffix := strconv.FormatUint(siphash.Sum64(hashKey, []byte("envoy id")), 16)
	for _, path := range [][]string{{"xds", "node", "id"}, {"node", "id"}} {
		id, err := proxywasm.GetProperty(path)
		if err != nil || len(id) == 0 || !printableID(id) {
			continue
		}
		if max := quota.MaxEnvoyBytes - 1 - len(suffix); len(id) > max {
			id = id[:max]
		}
		return string(id) + "~" + suffix
	}
	return "sluice-" + suffix
}

func printableID(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// leaseKeyPrefix is the shared-data key of a fleet rule's lease buckets up
// to the bucket number: lease bucket n's key is
// "sluice/<policy>/<rule id>/<layout>/q<entry size><fleet.Layout>/<n>" (see
// bucketKeyPrefix). The entry's size and layout name are part of the key, so a
// module whose lease entries are another size or mean another thing by a field
// (one still draining after an upgrade, sharing the vm_id) never reads this
// one's buckets.
func leaseKeyPrefix(policy, rule, layout string) string {
	return bucketKeyPrefix(policy, rule, layout) + "q" + strconv.Itoa(fleet.EntrySize) + fleet.Layout + "/"
}

// initFleetRule sets rs's fleet part.
func (p *pluginContext) initFleetRule(c *rules.Compiled, rs *ruleState) {
	cr := rs.cr
	if !cr.Fleet() {
		return
	}
	switch cr.Rule.QuotaFailure() {
	case rules.QuotaFailurePass:
		rs.fleet.mode = fleetPass
	case rules.QuotaFailureDeny:
		rs.fleet.mode = fleetDeny
	default:
		rs.fleet.mode = fleetLocal // the share is a cost multiplier (degrade)
	}
	rs.fleet.limit = cr.Config.Limit
	if c := cr.Config.Capacity(); c > 0 {
		rs.fleet.limit = c
	}
	rs.fleet.leaseKeys = make([]string, p.cfg.BucketsPerRule)
	prefix := leaseKeyPrefix(c.Name, cr.ID, p.layout())
	for n := range rs.fleet.leaseKeys {
		rs.fleet.leaseKeys[n] = prefix + strconv.Itoa(n)
	}
	rs.fleet.statusKey = prefix + "status"
}

// createLeaseBuckets makes the lease buckets of c's fleet rules exist (see
// createBuckets for why and how).
func (p *pluginContext) createLeaseBuckets(c *rules.Compiled) error {
	fleetRules := 0
	for i := 0; i < c.Len(); i++ {
		if c.Rule(i).Fleet() {
			fleetRules++
		}
	}
	if fleetRules == 0 {
		return nil // no host call for a policy without fleet rules
	}
	witness := casAbsent
	if _, cas, err := proxywasm.GetSharedData(hashKeyKey); err == nil {
		witness = cas
	}
	layout := p.layout()
	for i := 0; i < c.Len(); i++ {
		if !c.Rule(i).Fleet() {
			continue
		}
		prefix := leaseKeyPrefix(c.Name, c.Rule(i).ID, layout)
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
	return nil
}
