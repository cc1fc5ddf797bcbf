package rules

import "time"

// Policy is a named, versioned list of rules: the document the control plane stores
// and serves and the filter pulls. Each field's JSON name is in brackets. The struct
// is the JSON shape, unvalidated; [ParsePolicy] and [Policy.Validate] check it.
// Empty lists are nil after parsing, so that a parsed policy compares equal
// (reflect.DeepEqual) to the parse of its own encoding.
type Policy struct {
	// Name ["policy"] names the policy; it is a URL path segment of the control
	// plane's API, so it must satisfy [ValidName]. Required.
	Name string
	// Version ["version"] is set by the control plane, which bumps it on every change;
	// the filter only compares it. 0 is allowed (a policy not stored yet).
	Version uint64
	// Identity ["identity"] says which request headers carry the user and tenant ids
	// used by the "user" and "tenant" key parts and by exemptions.
	Identity Identity
	// Exempt ["exempt"] lists clients no rule of the policy applies to.
	Exempt Exempt
	// ResponseHeaders ["response_headers"] says which rate-limit headers the
	// policy's responses carry; nil (absent) leaves it to each Envoy's filter
	// configuration ("headers", "headers_on_allow").
	ResponseHeaders *ResponseHeaders
	// Rules ["rules"], at most [MaxRules], with distinct ids. Every rule that matches a
	// request is checked; see [Compiled.Match].
	Rules []Rule
}

// Identity names the request headers that carry the caller's identity. The filter
// trusts them as they arrive: an Envoy in front (JWT authentication, an ext_authz
// service) must set them and strip any the client sent.
type Identity struct {
	// UserHeader ["user_header"] is the lowercase name of the header carrying the user
	// id, e.g. "x-user-id". Empty: no user; the "user" key part is then invalid.
	UserHeader string
	// TenantHeader ["tenant_header"] is the lowercase name of the header carrying the
	// tenant id, e.g. "x-tenant-id". Empty: no tenant.
	TenantHeader string
}

// ResponseHeaders is a policy's choice of rate-limit response headers. The
// headers describe the decisive rule: on a denial the rule that denied, on an
// allowed response the matching enforced rule with the least remaining.
type ResponseHeaders struct {
	// Set ["set"] is the header set: [HeadersXRateLimit], [HeadersRateLimit],
	// [HeadersBoth] or [HeadersNone]. Required.
	Set string
	// OnAllow ["on_allow"]: allowed responses carry the set too, not only
	// denials. Default false, as Envoy's own rate-limit filters leave allowed
	// responses alone unless enable_x_ratelimit_headers is set. In the Wasm
	// filter each header on an allowed response is one more host call
	// (proxy_add_header_map_value); on a denial the headers ride on the one
	// local reply and cost no call.
	OnAllow bool
}

// The values of ResponseHeaders.Set.
const (
	// HeadersXRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the limit is whole again, rounded up):
	// the de facto set most HTTP APIs send.
	HeadersXRateLimit = "x-ratelimit"
	// HeadersRateLimit is RateLimit-Policy and RateLimit, structured-field
	// lists of one named policy with the q, w, r and t parameters
	// (draft-ietf-httpapi-ratelimit-headers-09 §3, §4).
	HeadersRateLimit = "ratelimit"
	// HeadersBoth is both sets.
	HeadersBoth = "both"
	// HeadersNone is no rate-limit header; a denial still carries
	// Retry-After.
	HeadersNone = "none"
)

// Exempt lists clients that a policy or a rule never limits nor counts. A request is
// exempt if any entry matches. Each list holds at most [MaxExemptEntries] entries.
type Exempt struct {
	// CIDRs ["cidrs"] are IP prefixes in CIDR notation ("10.0.0.0/8", "2001:db8::/32",
	// RFC 4632 / RFC 4291) or single addresses ("192.0.2.7"), compared with the client
	// IP the filter determined. Host bits must be zero ("10.0.0.1/8" is rejected).
	CIDRs []string
	// Users ["users"] are user ids (values of the identity user header), compared
	// exactly.
	Users []string
	// Tenants ["tenants"] are tenant ids, compared exactly.
	Tenants []string
}

// Rule is one limit: which requests it applies to, how they are grouped into
// counters, the algorithm and its parameters, what a request costs, and what a
// denied request gets. Each field's JSON name is in brackets; a zero field is omitted
// from the encoding and means the stated default.
type Rule struct {
	// ID ["id"] identifies the rule within its policy; it must satisfy [ValidID].
	// Required.
	ID string
	// Description ["description"] is free text for operators, at most
	// [MaxDescriptionBytes] bytes.
	Description string
	// Descriptor ["descriptor"], when present, makes the rule one the control
	// plane's rate limit service applies to descriptors; HTTP requests too only
	// with its "http" (see [Descriptor]). It requires "scope": "fleet" and
	// excludes cost_header, response_cost_header and exempt, and without "http"
	// match and key.
	Descriptor *Descriptor
	// Match ["match"] selects the requests the rule applies to; the zero Match
	// (absent) selects every request.
	Match Match
	// Key ["key"] lists the parts whose values, joined, name the counter a request
	// is counted under; nil (absent or []) is one global counter for the rule. Each
	// part is one of client_ip, user, tenant, route, method, path, header:<name>, or
	// alternatives separated by '|' ("user|client_ip": the user id, or the client IP
	// when there is none). See the package documentation for the exact semantics and
	// the counter key format. At most [MaxKeyParts] parts of [MaxKeyAlternatives]
	// alternatives each.
	Key []string
	// Algorithm ["algorithm"] is one of token_bucket, time_wheel, fixed_window, gcra,
	// sliding_log, concurrency (see package limit for each one's exact semantics).
	// Required.
	Algorithm string
	// Limit ["limit"] is the number of cost units admitted per Window (for
	// concurrency: in flight). Required; bounds from package limit
	// (limit.MaxLimit and the per-algorithm maxima).
	Limit uint64
	// Window ["window"] is the period of Limit, a duration string ("5m", "1.5s").
	// Required except for concurrency (where it is not allowed) and for a
	// calendar_day fixed_window (where it may be omitted or be "24h").
	Window time.Duration
	// Burst ["burst"]: token_bucket capacity in cost units (default Limit); gcra
	// requests admitted at once beyond the steady rate (default 0). Other algorithms:
	// not allowed.
	Burst uint64
	// Slots ["slots"]: time_wheel only, the number of slots the window is split into
	// (default limit.DefaultSlots, at most limit.MaxSlots).
	Slots uint32
	// Align ["align"]: fixed_window only; "calendar_day" makes each window one local
	// calendar day in Timezone, ending at local midnight. Empty: windows aligned to
	// the Unix epoch.
	Align string
	// Timezone ["timezone"] is an IANA time zone name ("Europe/Berlin"), only with
	// Align "calendar_day". Empty: UTC.
	Timezone string
	// Lease ["lease"]: concurrency only, how long an acquired slot is held at most if
	// its release is lost (default limit.DefaultLease).
	Lease time.Duration
	// Cost ["cost"] is what one request costs in cost units, 1 to [MaxCost]; 0
	// (absent) means 1. With CostHeader it is the cost used when that header is
	// missing or invalid.
	Cost uint64
	// CostHeader ["cost_header"] names a request header whose value, a decimal
	// integer, is the request's cost, clamped to [MinCost] (1: a header of 0
	// does not make a request free) .. MaxCost; see [Compiled.Cost]. Requires
	// MaxCost.
	CostHeader string
	// MaxCost ["max_cost"] is the largest cost CostHeader may set, 1 to [MaxCost];
	// only with CostHeader. A larger header value is clamped to it.
	MaxCost uint64
	// ResponseCostHeader ["response_cost_header"] names a response header whose value,
	// a decimal integer clamped to [MinCost]..max_cost, is the request's real cost,
	// known only afterwards (tokens an LLM used, say); the filter then corrects the
	// charge by the difference
	// (limit.Limiter.Adjust). Not allowed for sliding_log and concurrency, whose
	// state cannot be corrected, nor with scope fleet, whose leased units are spent
	// at admission.
	ResponseCostHeader string
	// Shadow ["shadow"]: evaluate, count and report, but never reject.
	Shadow bool
	// Status ["status"] is the HTTP status of a rejection, 400 to 599; 0 (absent)
	// means 429, or 503 for concurrency.
	Status int
	// Exempt ["exempt"] lists clients this rule does not apply to, in addition to the
	// policy's.
	Exempt Exempt
	// Scope ["scope"] is where the limit holds: [ScopeEnvoy] ("envoy", the default
	// when empty) counts per Envoy; [ScopeFleet] ("fleet") holds the limit across
	// every Envoy through leases from the control plane's quota service. fleet is
	// refused for algorithms whose fleet bound is not exact (sliding_log,
	// concurrency) and for a token_bucket or gcra of capacity 1 (see
	// [FleetCapable]).
	Scope string
	// OnQuotaFailure ["on_quota_failure"] is, for a fleet rule only, what the filter
	// does with a key it holds no quota for when the quota service cannot answer
	// (unreachable, no answer within the callout timeout, HTTP 503 or any other
	// non-200, an answer that does not decode): [QuotaFailureLocal] ("local", the
	// default when empty) enforces LocalSharePermille of the rule's limit per Envoy,
	// [QuotaFailurePass] ("pass") admits, [QuotaFailureDeny] ("deny") rejects.
	OnQuotaFailure string
	// LocalSharePermille ["local_share"] is, for on_quota_failure "local" only, the
	// smallest share of the rule's limit (and burst) each Envoy enforces by itself
	// while the quota service fails, in thousandths: JSON holds a number in (0, 1]
	// with at most three decimals ("local_share": 0.25 is 250). An Envoy that heard
	// from the service how many Envoys n share the key enforces 1/n of the limit, but
	// never less than this share (rounded to 1/k for the whole k = ⌊1/share⌋); one
	// that did not yet, this share. 0 (absent) means no floor: 1/n, or the whole
	// limit while n is unknown.
	LocalSharePermille uint32
}

// The values of Rule.OnQuotaFailure.
const (
	// QuotaFailureLocal enforces a local share of the limit per Envoy (the default).
	QuotaFailureLocal = "local"
	// QuotaFailurePass admits requests the quota service could not decide.
	QuotaFailurePass = "pass"
	// QuotaFailureDeny rejects them.
	QuotaFailureDeny = "deny"
)

// The values of Rule.Scope.
const (
	// ScopeEnvoy counts per Envoy (the default; an empty Scope means it).
	ScopeEnvoy = "envoy"
	// ScopeFleet holds the limit across the fleet through the quota service.
	ScopeFleet = "fleet"
)

// IsFleet reports whether r is fleet-scoped.
func (r *Rule) IsFleet() bool { return r.Scope == ScopeFleet }

// Match selects requests. All present conditions must hold; the zero Match selects
// every request.
type Match struct {
	// PathPrefix ["path_prefix"]: the request path (without query) starts with it,
	// byte for byte ("/v1/auth" also matches "/v1/authors"; end it with '/' to match
	// a segment). Must start with '/'. Not with Path.
	PathPrefix string
	// Path ["path"]: the request path (without query) equals it exactly. Must start
	// with '/'. Not with PathPrefix.
	Path string
	// Methods ["methods"]: the request method is one of these (RFC 9110 §9: methods
	// are case-sensitive, so they are written in upper case, e.g. "POST"). Empty:
	// any method. At most [MaxMethods].
	Methods []string
	// Headers ["headers"]: every condition holds. At most [MaxHeaderMatches].
	Headers []HeaderMatch
}

// HeaderMatch is a condition on one request header. Exactly one of Exact, Prefix,
// Present or Absent is set. When a header occurs several times, the first occurrence
// is tested.
type HeaderMatch struct {
	// Name ["name"] is the header name in lower case (RFC 9110 §5.1 token; HTTP/2 and
	// Envoy use lower case), or an Envoy pseudo-header such as ":authority".
	Name string
	// Exact ["exact"]: the value equals it (non-empty).
	Exact string
	// Prefix ["prefix"]: the value starts with it (non-empty).
	Prefix string
	// Present ["present"]: true means the header is present, whatever its value.
	Present bool
	// Absent ["absent"]: true means the header is not present.
	Absent bool
}
