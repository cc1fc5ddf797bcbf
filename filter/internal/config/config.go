// Package config is the sluice filter's plugin configuration: the JSON
// document Envoy hands to proxy_on_configure (the filter's
// config.configuration), parsed strictly by the pure function Parse.
//
// # Document
//
//	{
//	  "env": "prod",
//	  "policy": { <a policy document, see package rules> },
//	  "control_plane": {
//	    "cluster": "control_plane", "authority": "cp.internal",
//	    "policy": "default", "token_env": "SLUICE_READ_TOKEN",
//	    "wait": "30s", "timeout": "35s", "lease": "2s",
//	    "quota_token_env": "SLUICE_QUOTA_TOKEN", "quota_timeout": "1s",
//	    "quota_interval": "1s", "first_policy_wait": "1s", "envoy": "ingress-0"
//	  },
//	  "tick": "100ms",
//	  "buckets_per_rule": 1024,
//	  "entries_per_bucket": 16,
//	  "headers": "x-ratelimit",
//	  "headers_on_allow": false,
//	  "fail_mode": "open",
//	  "cas_retries": 16,
//	  "cas_fail_mode": "closed"
//	}
//
// Every member is optional and described on the Config field that holds it,
// with its default and bounds. An empty document (or none at all) is the
// defaults: no static policy, no control plane, fail open.
//
// # Errors
//
// Parse rejects unknown members, values of the wrong type or out of
// range, and an invalid policy; the error is an Errors value listing every
// problem with its JSON path ("tick: must be 10ms..1m",
// "policy.rules[0].window: must be > 0"). Errors matches ErrInvalid.
//
// # The client address
//
// The filter takes the client address from source.address, the trusted
// client address Envoy's HTTP connection manager computes from its
// use_remote_address and xff_num_trusted_hops (or an original-IP-detection
// extension) before any filter runs. The old member "trusted_hops", which
// made the filter parse X-Forwarded-For again with a different count, is
// accepted only as 0 (which changes nothing); any other value is an error
// that points to xff_num_trusted_hops.
//
// The package imports neither os nor anything that does (it runs inside
// the wasm filter; docs/ENVOY.md, WASI and the poll_oneoff crash): JSON
// goes through shared/strictjson.
package config

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// Bounds and defaults of the plugin configuration.
const (
	// MaxBytes is the largest configuration accepted, in bytes: a policy
	// (rules.MaxPolicyBytes) plus room for the other members.
	MaxBytes = rules.MaxPolicyBytes + 64<<10
	// DefaultTick is the tick period when "tick" is absent.
	DefaultTick = 100 * time.Millisecond
	// MinTick and MaxTick bound "tick".
	MinTick, MaxTick = 10 * time.Millisecond, time.Minute
	// DefaultBucketsPerRule is "buckets_per_rule" when absent: with
	// DefaultEntriesPerBucket, 16,384 keys live at once per rule.
	DefaultBucketsPerRule = 1024
	// MaxBucketsPerRule bounds "buckets_per_rule" (shared-data keys per rule).
	MaxBucketsPerRule = 4096
	// DefaultEntriesPerBucket is "entries_per_bucket" when absent.
	DefaultEntriesPerBucket = 16
	// DefaultCASRetries is "cas_retries" when absent.
	DefaultCASRetries = 16
	// MaxCASRetries bounds "cas_retries".
	MaxCASRetries = 1000
	// DefaultWait, DefaultTimeout and DefaultLease are the control plane's
	// "wait", "timeout" and "lease" when absent.
	DefaultWait, DefaultTimeout, DefaultLease = 30 * time.Second, 35 * time.Second, 2 * time.Second
	// MaxWait bounds the control plane's "wait" and "timeout".
	MaxWait = 10 * time.Minute
	// MaxTokenBytes bounds the control plane's "token".
	MaxTokenBytes = 4096
)

// HeaderStyle selects the rate-limit response headers ("headers"; a policy's
// response_headers.set, rules.ResponseHeaders, takes precedence).
type HeaderStyle uint8

// The header styles.
const (
	// HeadersXRateLimit ("x-ratelimit", the default): X-RateLimit-Limit,
	// X-RateLimit-Remaining, X-RateLimit-Reset (seconds until reset).
	HeadersXRateLimit HeaderStyle = iota
	// HeadersRateLimit ("ratelimit"): the IETF draft's RateLimit and
	// RateLimit-Policy structured fields
	// (draft-ietf-httpapi-ratelimit-headers-09).
	HeadersRateLimit
	// HeadersBoth ("both"): both of the above.
	HeadersBoth
	// HeadersNone ("none"): no rate-limit headers (Retry-After is still sent on
	// a denial).
	HeadersNone
)

var headerStyles = [...]string{"x-ratelimit", "ratelimit", "both", "none"}

// HeaderStyleNamed returns the style whose JSON name is name (the names of
// rules.HeadersXRateLimit and its siblings), and whether there is one.
func HeaderStyleNamed(name string) (HeaderStyle, bool) {
	for i, n := range headerStyles {
		if n == name {
			return HeaderStyle(i), true
		}
	}
	return 0, false
}

// String returns the JSON name of s.
func (s HeaderStyle) String() string {
	if int(s) < len(headerStyles) {
		return headerStyles[s]
	}
	return "headerstyle(" + strconv.Itoa(int(s)) + ")"
}

// XRateLimit reports whether s includes the X-RateLimit-* headers.
func (s HeaderStyle) XRateLimit() bool { return s == HeadersXRateLimit || s == HeadersBoth }

// IETF reports whether s includes the RateLimit and RateLimit-Policy fields.
func (s HeaderStyle) IETF() bool { return s == HeadersRateLimit || s == HeadersBoth }

// FailMode says what the filter does when it has no policy at all
// ("fail_mode").
type FailMode uint8

// The fail modes.
const (
	// FailOpen ("open", the default): requests pass, with filter state
	// reason "no_policy" in filter state.
	FailOpen FailMode = iota
	// FailClosed ("closed"): requests are denied with 503 while there is no
	// policy (neither a static one nor one from the control plane). Trouble
	// while serving (bad shared data) still fails open; CAS exhaustion
	// follows CASFailMode.
	FailClosed
)

// String returns the JSON name of m.
func (m FailMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// ControlPlane is the "control_plane" section: where rule sync pulls the
// policy from (used by the rule-sync code, filter/internal/policysync).
type ControlPlane struct {
	// Enabled reports whether the section was present.
	Enabled bool
	// Cluster ["cluster"] is the Envoy cluster name of the control plane, the first
	// argument of proxy_http_call. Required in the section.
	Cluster string
	// Authority ["authority"] is the :authority of the poll requests. Default:
	// Cluster.
	Authority string
	// Policy ["policy"] is the policy name to pull (rules.ValidName). Default
	// "default".
	Policy string
	// Token ["token"] is the read-only bearer token (at most MaxTokenBytes
	// visible ASCII bytes). Default: none. Written here it is readable by anyone
	// who can read the plugin configuration (a WasmPlugin, an
	// EnvoyExtensionPolicy): prefer TokenEnv.
	Token string
	// TokenEnv ["token_env"] names the VM environment variable holding the read
	// token instead (ValidEnvName; Envoy's vm_config.environment_variables,
	// which a Deployment fills from a Secret). The filter reads it when it is
	// configured: unset or empty, it warns and calls without a token; holding
	// anything but 1..MaxTokenBytes visible ASCII bytes, it fails the
	// configuration. Not with token. Default: none.
	TokenEnv string
	// Wait ["wait"] is the long-poll wait sent to the control plane, 1s..MaxWait.
	// Default DefaultWait.
	Wait time.Duration
	// Timeout ["timeout"] is the proxy_http_call timeout, greater than Wait and
	// at most MaxWait. Default DefaultTimeout, or Wait+5s when only wait is set.
	Timeout time.Duration
	// Lease ["lease"] is how long the sync leader's lease in shared data lasts,
	// 100ms..1m. Default DefaultLease.
	Lease time.Duration
	// QuotaToken ["quota_token"] is the bearer token of the control plane's quota
	// service (POST /v1/quota; the control plane's --quota-token), at most
	// MaxTokenBytes visible ASCII bytes. Default: none (the service answers 401, and
	// fleet rules degrade as their on_quota_failure says). Prefer QuotaTokenEnv.
	QuotaToken string
	// QuotaTokenEnv ["quota_token_env"] names the VM environment variable holding
	// the quota token, as TokenEnv does the read token. Not with quota_token.
	QuotaTokenEnv string
	// QuotaTimeout ["quota_timeout"] is the proxy_http_call timeout of quota calls:
	// the longest a request waits for quota before its rule degrades, 10ms..10s.
	// Default DefaultQuotaTimeout.
	QuotaTimeout time.Duration
	// QuotaInterval ["quota_interval"] is how often each worker reports use and tops
	// up leases running low, 10ms..1m (quota.MinInterval..quota.MaxInterval).
	// Default DefaultQuotaInterval.
	QuotaInterval time.Duration
	// FirstPolicyWait ["first_policy_wait"] is how long a request that arrives
	// before the first policy (no static one, none pulled yet: an Envoy just
	// started or restarted) is held, paused, for it: it is decided by the policy
	// as soon as a tick finds one, and by fail_mode (counted as no_policy) only
	// past this time after the plugin started, 0s..10s; 0s holds none. Default
	// DefaultFirstPolicyWait.
	FirstPolicyWait time.Duration
	// Envoy ["envoy"] identifies this Envoy to the quota service (1 to 128 visible
	// ASCII bytes). Default: Envoy's node id followed by "~" and a suffix derived
	// from the per-Envoy hash key ("sluice-<suffix>" without a node id), so that
	// replicas sharing one node.id are still told apart. Set it only to an id
	// unique per Envoy.
	Envoy string
}

// Quota call defaults.
const (
	// DefaultQuotaTimeout is the default control_plane.quota_timeout.
	DefaultQuotaTimeout = time.Second
	// DefaultQuotaInterval is the default control_plane.quota_interval.
	DefaultQuotaInterval = time.Second
	// DefaultFirstPolicyWait is the default control_plane.first_policy_wait.
	DefaultFirstPolicyWait = time.Second
	// MaxFirstPolicyWait bounds control_plane.first_policy_wait.
	MaxFirstPolicyWait = 10 * time.Second
)

// Config is the parsed plugin configuration. Each field's JSON name is in
// brackets.
type Config struct {
	// Env ["env"] is the environment name written into counter keys
	// (rules.ValidName). Default "default".
	Env string
	// Policy ["policy"] is the static policy, compiled with Env: used until one
	// arrives from the control plane, or for ever without one. nil when absent.
	Policy *rules.Compiled
	// ControlPlane ["control_plane"]: see ControlPlane.
	ControlPlane ControlPlane
	// Tick ["tick"] is the period of proxy_on_tick, MinTick..MaxTick. Default
	// DefaultTick.
	Tick time.Duration
	// BucketsPerRule ["buckets_per_rule"] is the number of shared-data buckets
	// of each rule, 1..MaxBucketsPerRule. Default DefaultBucketsPerRule. A
	// rule's shared data is BucketsPerRule × table.Layout.Size() bytes, 16 +
	// (EntriesPerBucket+1)·(16 + state size) each (560 KiB per token-bucket
	// rule with the defaults); shared data is never deleted.
	BucketsPerRule int
	// EntriesPerBucket ["entries_per_bucket"] is the number of keys a bucket
	// tracks at once, 1..table.MaxEntries. Default DefaultEntriesPerBucket.
	// Every request copies its whole bucket and every admission writes it back
	// whole, so more keys should come from more buckets, not bigger ones. Keys
	// beyond the live entries of a bucket share its overflow state (package
	// table's full-bucket policy).
	EntriesPerBucket int
	// Headers ["headers"] is the rate-limit header style of a policy that
	// does not choose one (response_headers.set). Default HeadersXRateLimit.
	Headers HeaderStyle
	// HeadersOnAllow ["headers_on_allow"]: allowed responses carry the
	// headers too, for a policy that does not choose (response_headers).
	// Default false: Envoy's local and global rate-limit filters leave
	// allowed responses alone unless enable_x_ratelimit_headers is set, and
	// each header added to an allowed response is one host call.
	HeadersOnAllow bool
	// FailMode ["fail_mode"]: "open" or "closed". Default FailOpen.
	FailMode FailMode
	// CASRetries ["cas_retries"] bounds the compare-and-swap re-reads of
	// each rule a request is counted by, 1..MaxCASRetries: a request
	// matching n rules makes at most n×(CASRetries+1) writes. Default
	// DefaultCASRetries.
	CASRetries int
	// CASFailMode ["cas_fail_mode"] is what a request whose rule ran out of
	// CAS retries gets: FailClosed ("closed", the default) denies it with
	// the rule's status and Retry-After 1 (a shadow rule drops its charge
	// instead), FailOpen ("open") lets it pass uncounted. Either way it is
	// counted in sluice.cas_exhausted with reason "cas_exhausted".
	CASFailMode FailMode
}

// trustedHopsRemoved is the error for a non-zero "trusted_hops".
const trustedHopsRemoved = "no longer supported: the client address is Envoy's trusted client address (source.address); " +
	"set xff_num_trusted_hops on the HTTP connection manager (Istio: meshConfig.defaultConfig.gatewayTopology.numTrustedProxies) " +
	"and remove trusted_hops"

// Default returns the configuration of an empty document.
func Default() Config {
	return Config{
		Env:              "default",
		Tick:             DefaultTick,
		BucketsPerRule:   DefaultBucketsPerRule,
		EntriesPerBucket: DefaultEntriesPerBucket,
		CASRetries:       DefaultCASRetries,
		CASFailMode:      FailClosed,
	}
}

// ErrInvalid is matched by errors.Is for every Errors value.
var ErrInvalid = errors.New("config: invalid plugin configuration")

// FieldError is one problem in the configuration: Field is its JSON path
// (e.g. "control_plane.wait"; "" is the document), Message what is wrong,
// and Error() is "field: message". It is the policy schema's type, so a
// configuration and the policy embedded in it report problems alike.
type FieldError = rules.FieldError

// Errors is every problem found in a configuration, in document order.
type Errors []FieldError

// Error joins the problems with "; ".
func (e Errors) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	for i, fe := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(fe.Error())
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e Errors) Is(target error) bool { return target == ErrInvalid }

// Parse decodes and validates a plugin configuration. An empty (or
// whitespace-only) doc yields Default(). On any problem it returns the
// zero Config and an Errors listing every problem found.
func Parse(doc []byte) (Config, error) {
	if len(strings.TrimSpace(string(doc))) == 0 {
		return Default(), nil
	}
	c := Default()
	p := parser{d: strictjson.NewDecoder(doc, strictjson.Limits{MaxBytes: MaxBytes, MaxDepth: rules.MaxDepth + 1})}
	var policyDoc []byte
	_ = p.d.Object(func(key string) error {
		switch key {
		case "env":
			c.Env = p.str()
		case "policy":
			if p.d.Null() {
				return nil
			}
			if p.d.Peek() != strictjson.Object {
				p.d.Fail("must be an object")
				return p.d.Skip()
			}
			raw, err := p.d.Raw()
			if err != nil {
				return err
			}
			policyDoc = raw
		case "control_plane":
			return p.controlPlane(&c.ControlPlane)
		case "tick":
			c.Tick = p.duration(c.Tick)
		case "trusted_hops":
			// Removed: see "The client address" in the package doc.
			if !p.d.Null() {
				if v, err := p.d.Int64(); err == nil && v != 0 {
					p.d.Fail(trustedHopsRemoved)
				}
			}
		case "buckets_per_rule":
			c.BucketsPerRule = p.intIn(c.BucketsPerRule, 1, MaxBucketsPerRule)
		case "entries_per_bucket":
			c.EntriesPerBucket = p.intIn(c.EntriesPerBucket, 1, table.MaxEntries)
		case "headers":
			s := p.str()
			style, found := HeaderStyleNamed(s)
			if found {
				c.Headers = style
			}
			if !found && s != "" {
				p.d.Fail(`must be "x-ratelimit", "ratelimit", "both" or "none"`)
			}
		case "headers_on_allow":
			if !p.d.Null() {
				c.HeadersOnAllow, _ = p.d.Bool()
			}
		case "fail_mode":
			c.FailMode = p.failMode(FailOpen)
		case "cas_fail_mode":
			c.CASFailMode = p.failMode(FailClosed)
		case "cas_retries":
			c.CASRetries = p.intIn(c.CASRetries, 1, MaxCASRetries)
		default:
			return p.d.UnknownField()
		}
		return nil
	})
	_ = p.d.End()
	for _, e := range p.d.Errors() {
		p.errs = append(p.errs, FieldError{Field: e.Path, Message: e.Message})
	}
	if len(p.errs) > 0 {
		return Config{}, p.errs
	}
	if c.Env == "" {
		c.Env = "default"
	}
	if !rules.ValidName(c.Env) {
		p.fail("env", "must be 1 to 63 bytes of [a-z0-9_.-] starting with [a-z0-9]")
	}
	p.validateControlPlane(&c.ControlPlane)
	if policyDoc != nil && len(p.errs) == 0 {
		c.Policy = p.policy(policyDoc, c)
	}
	if len(p.errs) > 0 {
		return Config{}, p.errs
	}
	return c, nil
}

// CheckPolicy reports whether every rule of a compiled policy fits the
// bucket layout of c (table.New: a bucket of EntriesPerBucket entries of the
// rule's state must not exceed table.MaxBucketSize), as a FieldError at
// field+".rules[i]" for the first rule that does not.
func (c Config) CheckPolicy(p *rules.Compiled, field string) error {
	for i := 0; i < p.Len(); i++ {
		if _, err := table.New(p.Rule(i).Limiter, c.EntriesPerBucket); err != nil {
			return FieldError{
				Field:   strictjson.JoinPath(field, "rules["+strconv.Itoa(i)+"]"),
				Message: "a bucket of entries_per_bucket=" + strconv.Itoa(c.EntriesPerBucket) + " entries of this rule's state exceeds " + strconv.Itoa(table.MaxBucketSize) + " bytes (" + err.Error() + ")",
			}
		}
	}
	return nil
}

type parser struct {
	d    *strictjson.Decoder
	errs Errors
}

func (p *parser) fail(field, msg string) {
	p.errs = append(p.errs, FieldError{Field: field, Message: msg})
}

func (p *parser) str() string {
	if p.d.Null() {
		return ""
	}
	s, _ := p.d.String()
	return s
}

// failMode reads "open" or "closed"; null or "" is def.
func (p *parser) failMode(def FailMode) FailMode {
	switch s := p.str(); s {
	case "":
		return def
	case "open":
		return FailOpen
	case "closed":
		return FailClosed
	default:
		p.d.Fail(`must be "open" or "closed"`)
		return def
	}
}

func (p *parser) duration(def time.Duration) time.Duration {
	if p.d.Null() {
		return def
	}
	v, err := p.d.Duration()
	if err != nil {
		return def
	}
	if v < MinTick || v > MaxTick {
		p.d.Fail("must be " + strictjson.FormatDuration(MinTick) + ".." + strictjson.FormatDuration(MaxTick))
	}
	return v
}

func (p *parser) intIn(def, lo, hi int) int {
	if p.d.Null() {
		return def
	}
	v, err := p.d.Int64()
	if err != nil {
		return def
	}
	if v < int64(lo) || v > int64(hi) {
		p.d.Fail("must be " + strconv.Itoa(lo) + ".." + strconv.Itoa(hi))
		return def
	}
	return int(v)
}

func (p *parser) controlPlane(cp *ControlPlane) error {
	if p.d.Null() {
		return nil
	}
	cp.Enabled = true
	cp.FirstPolicyWait = -1 // absent: the default (0s holds none)
	dur := func(def time.Duration) time.Duration {
		if p.d.Null() {
			return def
		}
		v, err := p.d.Duration()
		if err != nil {
			return def
		}
		return v
	}
	return p.d.Object(func(key string) error {
		switch key {
		case "cluster":
			cp.Cluster = p.str()
		case "authority":
			cp.Authority = p.str()
		case "policy":
			cp.Policy = p.str()
		case "token":
			cp.Token = p.str()
		case "token_env":
			cp.TokenEnv = p.str()
		case "quota_token_env":
			cp.QuotaTokenEnv = p.str()
		case "wait":
			cp.Wait = dur(0)
		case "timeout":
			cp.Timeout = dur(0)
		case "lease":
			cp.Lease = dur(0)
		case "quota_token":
			cp.QuotaToken = p.str()
		case "quota_timeout":
			cp.QuotaTimeout = dur(0)
		case "quota_interval":
			cp.QuotaInterval = dur(0)
		case "first_policy_wait":
			cp.FirstPolicyWait = dur(-1)
		case "envoy":
			cp.Envoy = p.str()
		default:
			return p.d.UnknownField()
		}
		return nil
	})
}

func (p *parser) validateControlPlane(cp *ControlPlane) {
	if !cp.Enabled {
		return
	}
	const f = "control_plane."
	if cp.Cluster == "" {
		p.fail(f+"cluster", "required")
	} else if !printable(cp.Cluster, 255) {
		p.fail(f+"cluster", "must be 1 to 255 visible ASCII bytes")
	}
	if cp.Authority == "" {
		cp.Authority = cp.Cluster
	} else if !printable(cp.Authority, 255) {
		p.fail(f+"authority", "must be 1 to 255 visible ASCII bytes")
	}
	if cp.Policy == "" {
		cp.Policy = "default"
	} else if !rules.ValidName(cp.Policy) {
		p.fail(f+"policy", "must be 1 to 63 bytes of [a-z0-9_.-] starting with [a-z0-9]")
	}
	if cp.Token != "" && !printable(cp.Token, MaxTokenBytes) {
		p.fail(f+"token", "must be visible ASCII, at most "+strconv.Itoa(MaxTokenBytes)+" bytes")
	}
	for _, e := range []struct{ name, inline, field string }{{cp.TokenEnv, cp.Token, "token"}, {cp.QuotaTokenEnv, cp.QuotaToken, "quota_token"}} {
		switch {
		case e.name == "":
		case !ValidEnvName(e.name):
			p.fail(f+e.field+"_env", "must be an environment variable name: 1 to 128 bytes of [A-Za-z0-9_], not starting with a digit")
		case e.inline != "":
			p.fail(f+e.field+"_env", "set with "+e.field+": give the token inline or name its variable, not both")
		}
	}
	switch {
	case cp.Wait == 0:
		cp.Wait = DefaultWait
	case cp.Wait < time.Second || cp.Wait > MaxWait:
		p.fail(f+"wait", "must be 1s.."+strictjson.FormatDuration(MaxWait))
	}
	switch {
	case cp.Timeout == 0:
		cp.Timeout = cp.Wait + 5*time.Second
		if cp.Wait == DefaultWait {
			cp.Timeout = DefaultTimeout
		}
	case cp.Timeout <= cp.Wait || cp.Timeout > MaxWait+5*time.Second:
		p.fail(f+"timeout", "must be greater than wait and at most "+strictjson.FormatDuration(MaxWait+5*time.Second))
	}
	switch {
	case cp.Lease == 0:
		cp.Lease = DefaultLease
	case cp.Lease < 100*time.Millisecond || cp.Lease > time.Minute:
		p.fail(f+"lease", "must be 100ms..1m")
	}
	if cp.QuotaToken != "" && !printable(cp.QuotaToken, MaxTokenBytes) {
		p.fail(f+"quota_token", "must be visible ASCII, at most "+strconv.Itoa(MaxTokenBytes)+" bytes")
	}
	switch {
	case cp.QuotaTimeout == 0:
		cp.QuotaTimeout = DefaultQuotaTimeout
	case cp.QuotaTimeout < 10*time.Millisecond || cp.QuotaTimeout > 10*time.Second:
		p.fail(f+"quota_timeout", "must be 10ms..10s")
	}
	switch {
	case cp.QuotaInterval == 0:
		cp.QuotaInterval = DefaultQuotaInterval
	case cp.QuotaInterval < 10*time.Millisecond || cp.QuotaInterval > time.Minute:
		p.fail(f+"quota_interval", "must be 10ms..1m")
	}
	switch {
	case cp.FirstPolicyWait < 0:
		cp.FirstPolicyWait = DefaultFirstPolicyWait
	case cp.FirstPolicyWait > MaxFirstPolicyWait:
		p.fail(f+"first_policy_wait", "must be 0s.."+strictjson.FormatDuration(MaxFirstPolicyWait))
	}
	if cp.Envoy != "" && !printable(cp.Envoy, 128) {
		p.fail(f+"envoy", "must be 1 to 128 visible ASCII bytes")
	}
}

// policy parses, compiles and layout-checks the static policy, reporting
// problems under "policy.".
func (p *parser) policy(doc []byte, c Config) *rules.Compiled {
	pol, err := rules.ParsePolicy(doc)
	if err != nil {
		var fes rules.Errors
		if errors.As(err, &fes) {
			for _, fe := range fes {
				p.fail(strictjson.JoinPath("policy", fe.Field), fe.Message)
			}
		} else {
			p.fail("policy", err.Error())
		}
		return nil
	}
	comp, err := rules.Compile(pol, rules.CompileOptions{Env: c.Env})
	if err != nil {
		p.fail("policy", err.Error())
		return nil
	}
	if err := c.CheckPolicy(comp, "policy"); err != nil {
		fe := err.(FieldError)
		p.errs = append(p.errs, fe)
		return nil
	}
	return comp
}

func printable(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// ValidEnvName reports whether name can name a VM environment variable in
// token_env and quota_token_env: 1 to 128 bytes of [A-Za-z0-9_], not starting
// with a digit (the POSIX portable name, which Kubernetes and Envoy accept).
func ValidEnvName(name string) bool {
	if name == "" || len(name) > 128 || (name[0] >= '0' && name[0] <= '9') {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// Printable reports whether s is 1 to max visible ASCII bytes: what a token
// (inline or read from the environment) must be.
func Printable(s string, max int) bool { return printable(s, max) }
