package rules

import (
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// FleetCapable reports whether a rule with limit configuration cfg may be
// fleet-scoped ([ScopeFleet]), and if not, why (a message for the "scope" field).
//
// The quota service hands out shares of a global state decided with the same
// Limiter, and every supported algorithm admits, across the fleet, never more than
// the rule allows:
//
//   - fixed_window and time_wheel: a share expires at the end of the window or
//     slot it was counted in, so every unit is spent where it was counted;
//   - token_bucket and gcra: a share is valid for at most V, and the global bucket
//     is kept smaller by the V·Limit/Window units that refill meanwhile, which
//     needs a capacity of at least 2 (half of it at most is set aside);
//   - sliding_log: refused, its state has no correction (Adjust), so unused units
//     could never be returned, and a log of grant times is not a log of request
//     times;
//   - concurrency: refused, a slot's lease starts when it is granted to an Envoy,
//     not when a request takes it, so a request started late in a share's life
//     would stop being counted before the rule's lease: release cannot be exact
//     without a round trip per request.
func FleetCapable(cfg limit.Config) (ok bool, reason string) {
	switch cfg.Algorithm {
	case limit.FixedWindow, limit.TimeWheel:
		return true, ""
	case limit.TokenBucket:
		if cfg.Burst == 1 || (cfg.Burst == 0 && cfg.Limit < 2) {
			return false, "fleet needs a token_bucket capacity (burst, default limit) of at least 2"
		}
		return true, ""
	case limit.GCRA:
		if cfg.Burst < 1 {
			return false, "fleet needs a gcra burst of at least 1"
		}
		return true, ""
	case limit.SlidingLog:
		return false, "fleet is not supported by sliding_log (its state cannot return unused units)"
	case limit.Concurrency:
		return false, "fleet is not supported by concurrency (a granted slot cannot be released exactly without a round trip per request)"
	}
	return false, "fleet is not supported by this algorithm"
}

// scope validates r.Scope; cfg is r's limit configuration, valid when ok.
func (v *validator) scope(r *Rule, field string, cfg limit.Config, ok bool) {
	switch r.Scope {
	case "", ScopeEnvoy:
	case ScopeFleet:
		if ok {
			if capable, reason := FleetCapable(cfg); !capable {
				v.add(join(field, "scope"), reason)
			}
		}
		if r.ResponseCostHeader != "" {
			// A lease's units are spent when the request is admitted; units found
			// due afterwards could not be taken from the global budget.
			v.add(join(field, "response_cost_header"), "not supported with \"scope\": \"fleet\" (a leased unit cannot be charged after the fact)")
		}
	default:
		v.add(join(field, "scope"), "must be "+quoteClipped(ScopeEnvoy)+" or "+quoteClipped(ScopeFleet)+", got "+quoteClipped(r.Scope))
	}
	switch r.OnQuotaFailure {
	case "", QuotaFailureLocal, QuotaFailurePass, QuotaFailureDeny:
		if r.OnQuotaFailure != "" && !r.IsFleet() {
			v.add(join(field, "on_quota_failure"), "only with \"scope\": \"fleet\"")
		}
	default:
		v.add(join(field, "on_quota_failure"), "must be "+quoteClipped(QuotaFailureLocal)+", "+quoteClipped(QuotaFailurePass)+" or "+quoteClipped(QuotaFailureDeny)+", got "+quoteClipped(r.OnQuotaFailure))
	}
	if r.LocalSharePermille != 0 {
		switch {
		case r.LocalSharePermille > 1000:
			v.add(join(field, "local_share"), "must be greater than 0 and at most 1")
		case !r.IsFleet():
			v.add(join(field, "local_share"), "only with \"scope\": \"fleet\"")
		case r.OnQuotaFailure != "" && r.OnQuotaFailure != QuotaFailureLocal:
			v.add(join(field, "local_share"), "only with \"on_quota_failure\": \"local\" (the default)")
		}
	}
}

// QuotaFailure returns the rule's on_quota_failure with the default applied:
// [QuotaFailureLocal], [QuotaFailurePass] or [QuotaFailureDeny].
func (r *Rule) QuotaFailure() string {
	if r.OnQuotaFailure == "" {
		return QuotaFailureLocal
	}
	return r.OnQuotaFailure
}

// parsePermille parses a JSON number in (0, 1] with at most three decimals
// into thousandths.
func parsePermille(num string) (uint32, bool) {
	if num == "1" || num == "1.0" || num == "1.00" || num == "1.000" {
		return 1000, true
	}
	if len(num) < 3 || len(num) > 5 || num[0] != '0' || num[1] != '.' {
		return 0, false
	}
	v := uint32(0)
	digits := num[2:]
	for i := 0; i < 3; i++ {
		v *= 10
		if i < len(digits) {
			c := digits[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			v += uint32(c - '0')
		}
	}
	return v, v > 0
}

// formatPermille writes thousandths as the shortest decimal parsePermille reads.
func formatPermille(v uint32) string {
	if v >= 1000 {
		return "1"
	}
	s := strconv.FormatUint(uint64(v+1000), 10)[1:] // three digits
	for len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return "0." + s
}

// Fleet reports whether the rule is fleet-scoped.
func (r *CompiledRule) Fleet() bool { return r.Rule != nil && r.Rule.IsFleet() }

// OwnsKey reports whether key is a counter key this rule can build (see the
// package documentation for the format): it starts with the rule's
// "rl:{env}:{policy}/{rule}:" prefix, ends with its ":{period}s" suffix, and has a
// non-empty identifier in between. It does not check that the identifier's tags
// match the rule's key parts. It does not allocate.
func (r *CompiledRule) OwnsKey(key string) bool {
	if len(key) <= len(r.keyPrefix)+len(r.keySuffix) {
		return false
	}
	if !strings.HasPrefix(key, r.keyPrefix) || !strings.HasSuffix(key, r.keySuffix) {
		return false
	}
	id := key[len(r.keyPrefix) : len(key)-len(r.keySuffix)]
	if len(r.parts) == 0 {
		return id == "*"
	}
	return id != "*" && !strings.ContainsRune(id, ':')
}
