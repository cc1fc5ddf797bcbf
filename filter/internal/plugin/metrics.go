package plugin

import "github.com/sluice-proxy/sluice/filter/proxywasm"

// Metric names (Envoy shows them without its "wasmcustom." prefix; see the
// docs/filter.md, "Filter: metrics"). Per rule, <id> is the rule id.
const (
	metricRulePrefix       = "sluice.rule."
	metricAllowed          = ".allowed"        // admitted by the rule (enforced or shadow)
	metricLimited          = ".limited"        // denied by the rule
	metricShadowLimited    = ".shadow_limited" // a shadow rule would have denied
	metricRuleFailedOpen   = ".failed_open"    // passed because the rule could not be evaluated
	metricRuleOverflow     = ".overflow"       // decided against a full bucket's shared overflow state
	metricFailedOpen       = "sluice.failed_open"
	metricNoPolicy         = "sluice.no_policy"
	metricHeldForPolicy    = "sluice.held_for_policy" // requests held (paused) for the first policy
	metricCASRetries       = "sluice.cas_retries"
	metricCASExhausted     = "sluice.cas_exhausted"
	metricOverflow         = "sluice.bucket_overflow"
	metricCorrupt          = "sluice.bucket_corrupt"
	metricCostInvalid      = "sluice.cost_header_invalid"
	metricCompensationLost = "sluice.compensation_lost"
	metricPolicyVersion    = "sluice.policy_version"
)

// counter is a proxy-wasm counter whose increments are summed in the VM
// and handed to the host on each tick (flush), so the request path makes no
// metric hostcall: Envoy's stats are read periodically anyway, and a tick
// (100 ms by default) is far below its 5 s flush interval. Definition
// errors are ignored: an undefined counter has id 0, and Envoy answers
// NOT_FOUND to its increments, which are ignored too.
type counter struct {
	m       proxywasm.MetricCounter
	pending uint64
}

// Increment adds n to the counter, in the VM.
func (c *counter) Increment(n uint64) { c.pending += n }

func (c *counter) flush() {
	if c.pending > 0 {
		_ = c.m.Increment(c.pending)
		c.pending = 0
	}
}

// metrics are the plugin-wide metrics.
type metrics struct {
	failedOpen       counter
	noPolicy         counter
	heldForPolicy    counter
	casRetries       counter
	casExhausted     counter
	overflow         counter
	corrupt          counter
	costInvalid      counter
	compensationLost counter
	policyVersion    proxywasm.MetricGauge
}

func (m *metrics) define() {
	m.failedOpen.m, _ = proxywasm.DefineCounterMetric(metricFailedOpen)
	m.noPolicy.m, _ = proxywasm.DefineCounterMetric(metricNoPolicy)
	m.heldForPolicy.m, _ = proxywasm.DefineCounterMetric(metricHeldForPolicy)
	m.casRetries.m, _ = proxywasm.DefineCounterMetric(metricCASRetries)
	m.casExhausted.m, _ = proxywasm.DefineCounterMetric(metricCASExhausted)
	m.overflow.m, _ = proxywasm.DefineCounterMetric(metricOverflow)
	m.corrupt.m, _ = proxywasm.DefineCounterMetric(metricCorrupt)
	m.costInvalid.m, _ = proxywasm.DefineCounterMetric(metricCostInvalid)
	m.compensationLost.m, _ = proxywasm.DefineCounterMetric(metricCompensationLost)
	m.policyVersion, _ = proxywasm.DefineGaugeMetric(metricPolicyVersion)
}

func (m *metrics) flush() {
	for _, c := range [...]*counter{&m.failedOpen, &m.noPolicy, &m.heldForPolicy, &m.casRetries, &m.casExhausted,
		&m.overflow, &m.corrupt, &m.costInvalid, &m.compensationLost} {
		c.flush()
	}
}

// ruleMetrics are one rule id's counters. They are defined once per rule id
// and VM and kept across policy versions.
type ruleMetrics struct {
	allowed, limited, shadowLimited, failedOpen counter
	// overflow counts the rule's decisions made against a bucket's overflow
	// state: every entry of the bucket was live (the table is saturated).
	overflow counter
}

// flushMetrics hands every pending increment to the host (on each tick and
// at shutdown).
func (p *pluginContext) flushMetrics() {
	p.m.flush()
	for _, m := range p.ruleStats {
		m.flush()
	}
}

// flush hands the rule's pending increments to the host.
func (m *ruleMetrics) flush() {
	m.allowed.flush()
	m.limited.flush()
	m.shadowLimited.flush()
	m.failedOpen.flush()
	m.overflow.flush()
}

func (p *pluginContext) ruleMetrics(id string) *ruleMetrics {
	if m, ok := p.ruleStats[id]; ok {
		return m
	}
	if p.ruleStats == nil {
		p.ruleStats = map[string]*ruleMetrics{}
	}
	m := new(ruleMetrics)
	base := metricRulePrefix + id
	m.allowed.m, _ = proxywasm.DefineCounterMetric(base + metricAllowed)
	m.limited.m, _ = proxywasm.DefineCounterMetric(base + metricLimited)
	m.shadowLimited.m, _ = proxywasm.DefineCounterMetric(base + metricShadowLimited)
	m.failedOpen.m, _ = proxywasm.DefineCounterMetric(base + metricRuleFailedOpen)
	m.overflow.m, _ = proxywasm.DefineCounterMetric(base + metricRuleOverflow)
	p.ruleStats[id] = m
	return m
}
