package plugin

import "github.com/sluice-proxy/sluice/filter/proxywasm"

// Metric names (Envoy shows them without its "wasmcustom." prefix; see the
// README's "Metrics" section). Per rule, <id> is the rule id.
const (
	metricRulePrefix       = "sluice.rule."
	metricAllowed          = ".allowed"        // admitted by the rule (enforced or shadow)
	metricLimited          = ".limited"        // denied by the rule
	metricShadowLimited    = ".shadow_limited" // a shadow rule would have denied
	metricRuleFailedOpen   = ".failed_open"    // passed because the rule could not be evaluated
	metricFailedOpen       = "sluice.failed_open"
	metricNoPolicy         = "sluice.no_policy"
	metricCASRetries       = "sluice.cas_retries"
	metricCASExhausted     = "sluice.cas_exhausted"
	metricEvictions        = "sluice.bucket_evictions"
	metricCorrupt          = "sluice.bucket_corrupt"
	metricCostInvalid      = "sluice.cost_header_invalid"
	metricCompensationLost = "sluice.compensation_lost"
	metricPolicyVersion    = "sluice.policy_version"
)

// metrics are the plugin-wide metrics. Definition errors are ignored: a
// metric that could not be defined has id 0, and Envoy answers NOT_FOUND
// to its increments, which are ignored too.
type metrics struct {
	failedOpen       proxywasm.MetricCounter
	noPolicy         proxywasm.MetricCounter
	casRetries       proxywasm.MetricCounter
	casExhausted     proxywasm.MetricCounter
	evictions        proxywasm.MetricCounter
	corrupt          proxywasm.MetricCounter
	costInvalid      proxywasm.MetricCounter
	compensationLost proxywasm.MetricCounter
	policyVersion    proxywasm.MetricGauge
}

func (m *metrics) define() {
	m.failedOpen, _ = proxywasm.DefineCounterMetric(metricFailedOpen)
	m.noPolicy, _ = proxywasm.DefineCounterMetric(metricNoPolicy)
	m.casRetries, _ = proxywasm.DefineCounterMetric(metricCASRetries)
	m.casExhausted, _ = proxywasm.DefineCounterMetric(metricCASExhausted)
	m.evictions, _ = proxywasm.DefineCounterMetric(metricEvictions)
	m.corrupt, _ = proxywasm.DefineCounterMetric(metricCorrupt)
	m.costInvalid, _ = proxywasm.DefineCounterMetric(metricCostInvalid)
	m.compensationLost, _ = proxywasm.DefineCounterMetric(metricCompensationLost)
	m.policyVersion, _ = proxywasm.DefineGaugeMetric(metricPolicyVersion)
}

// ruleMetrics are one rule id's counters. They are defined once per rule id
// and VM and kept across policy versions.
type ruleMetrics struct {
	allowed, limited, shadowLimited, failedOpen proxywasm.MetricCounter
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
	m.allowed, _ = proxywasm.DefineCounterMetric(base + metricAllowed)
	m.limited, _ = proxywasm.DefineCounterMetric(base + metricLimited)
	m.shadowLimited, _ = proxywasm.DefineCounterMetric(base + metricShadowLimited)
	m.failedOpen, _ = proxywasm.DefineCounterMetric(base + metricRuleFailedOpen)
	p.ruleStats[id] = m
	return m
}
