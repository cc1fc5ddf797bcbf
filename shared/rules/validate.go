package rules

import (
	"errors"
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// Bounds on policies. They keep a policy small enough to validate, store in shared
// data and match per request cheaply.
const (
	// MaxPolicyBytes is the largest policy document accepted, in bytes: 1 MiB.
	MaxPolicyBytes = 1 << 20
	// MaxRuleBytes is the largest single-rule document accepted by ParseRule: 64 KiB.
	MaxRuleBytes = 64 << 10
	// MaxDepth is the deepest JSON nesting accepted (a policy needs 6).
	MaxDepth = 16
	// MaxRules is the largest number of rules in a policy.
	MaxRules = 256
	// MaxIDBytes is the longest rule id and policy name, in bytes.
	MaxIDBytes = 63
	// MaxDescriptionBytes is the longest description, in bytes.
	MaxDescriptionBytes = 1024
	// MaxPathBytes is the longest path or path_prefix, in bytes.
	MaxPathBytes = 1024
	// MaxHeaderNameBytes is the longest header name, in bytes.
	MaxHeaderNameBytes = 128
	// MaxHeaderValueBytes is the longest header value in a match, in bytes.
	MaxHeaderValueBytes = 1024
	// MaxMethods is the largest number of methods in a match.
	MaxMethods = 16
	// MaxMethodBytes is the longest method, in bytes.
	MaxMethodBytes = 32
	// MaxHeaderMatches is the largest number of header conditions in a match.
	MaxHeaderMatches = 16
	// MaxKeyValueBytes is the longest key-part value a counter key carries as it
	// is, escaped, in bytes; a longer one is carried as its digest, 45 bytes (see
	// the package documentation), whatever the client sent.
	MaxKeyValueBytes = 128
	// MaxKeyBytes is the longest counter key a rule may build, in bytes: Compile
	// refuses a rule whose key could be longer (only very long header names in
	// many key parts come near).
	MaxKeyBytes = 2048
	// MaxKeyParts is the largest number of parts in a rule's key.
	MaxKeyParts = 8
	// MaxKeyAlternatives is the largest number of '|'-separated alternatives in one
	// key part.
	MaxKeyAlternatives = 4
	// MaxExemptEntries is the largest number of entries in each list of an Exempt.
	MaxExemptEntries = 256
	// MaxExemptIDBytes is the longest user or tenant id in an Exempt, in bytes.
	MaxExemptIDBytes = 256
	// MaxCost is the largest cost and max_cost, in cost units (= limit.MaxLimit).
	MaxCost = limit.MaxLimit
	// MinCost is the least a request costs, in cost units: a cost header or
	// response cost header below it (0) counts as MinCost, so no request is
	// free and a concurrency rule's cost header cannot take zero slots.
	MinCost = 1
	// MinStatus and MaxStatus bound a rule's status (RFC 9110 §15: client and
	// server error classes).
	MinStatus, MaxStatus = 400, 599
)

// FieldError is one problem in a policy or rule document.
type FieldError struct {
	// Field is the JSON path of the offending value, e.g. "rules[2].window"; "" means
	// the document as a whole (malformed JSON at the top level, too large).
	Field string
	// Message says what is wrong, e.g. "must be > 0".
	Message string
	// Decoding is true for a problem found while reading the JSON (malformed, or
	// a value of the wrong type or range); Offset is then the byte offset in the
	// document where it was found. Validation problems have neither.
	Decoding bool
	Offset   int
}

// Error returns "field: message", or the message alone when Field is "".
func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// Errors is every problem found in a document, in document order for decoding
// problems, then in field order for validation problems. ParsePolicy, ParseRule,
// Policy.Validate and Rule.Validate return it (never empty) as their error; find it
// with errors.As.
type Errors []FieldError

// Error joins the problems with "; ".
func (e Errors) Error() string {
	var b []byte
	for i, f := range e {
		if i > 0 {
			b = append(b, "; "...)
		}
		b = append(b, f.Error()...)
	}
	return string(b)
}

// ErrInvalid is matched by errors.Is for every Errors value, so callers can branch on
// "the document is invalid" without errors.As.
var ErrInvalid = errors.New("rules: invalid policy")

// Is reports whether target is ErrInvalid.
func (e Errors) Is(target error) bool { return target == ErrInvalid }

// ValidName reports whether name is a valid policy name: 1 to 63 bytes of
// [a-z0-9_.-] starting with [a-z0-9]. Such a name is safe as a URL path segment, a
// Redis key part and a shared-data key part.
func ValidName(name string) bool { return validIdent(name) }

// ValidID reports whether id is a valid rule id; the charset is that of [ValidName].
func ValidID(id string) bool { return validIdent(id) }

const identRule = "must be 1 to 63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit"

func validIdent(s string) bool {
	if len(s) == 0 || len(s) > MaxIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '.' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// isTchar reports whether c is an RFC 9110 §5.6.2 tchar.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// ValidHeaderName reports whether name is a header name sluice accepts: an RFC 9110
// §5.1 field name (a token) in lower case, or an HTTP/2 pseudo-header (':' followed
// by such a token, e.g. ":authority"), at most MaxHeaderNameBytes bytes. Envoy hands
// header names to filters in lower case.
func ValidHeaderName(name string) bool {
	if len(name) > MaxHeaderNameBytes {
		return false
	}
	if len(name) > 0 && name[0] == ':' {
		name = name[1:]
	}
	if len(name) == 0 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !isTchar(c) || (c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

const headerNameRule = "must be a lower-case HTTP header name (RFC 9110 token, at most 128 bytes)"

// validMethod reports whether m is an RFC 9110 §9.1 method token, in upper case.
func validMethod(m string) bool {
	if len(m) == 0 || len(m) > MaxMethodBytes {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !isTchar(c) || (c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

// MaxErrors is how many problems one document reports at most; past it the list
// ends with a FieldError{Field: "", Message: "too many errors; only the first 100 are
// listed"}, so a hostile document cannot make validation build a huge list.
const MaxErrors = 100

const tooMany = "too many errors; only the first 100 are listed"

// validator collects FieldErrors.
type validator struct {
	errs Errors
	full bool
}

func (v *validator) add(field, msg string) {
	if v.full {
		return
	}
	if len(v.errs) >= MaxErrors {
		v.full = true
		v.errs = append(v.errs, FieldError{Message: tooMany})
		return
	}
	v.errs = append(v.errs, FieldError{Field: field, Message: msg})
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case b[0] == '[':
		return a + b
	}
	return a + "." + b
}

// elemPath is the JSON path of element i of the array at field: "rules[2]".
func elemPath(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// quoteClipped quotes s for an error message, cut to 64 bytes.
func quoteClipped(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}

// Validate checks the policy against the schema and bounds described on each field
// and returns every problem as Errors, or nil. It is what ParsePolicy runs after
// decoding; the control plane runs it on a policy it assembled (after adding or
// replacing a rule), since only the whole policy can check duplicate rule ids and
// that the "user" and "tenant" key parts have identity headers.
func (p *Policy) Validate() error {
	var v validator
	v.policy(p)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

// Validate checks one rule on its own (everything but what needs the policy: duplicate
// ids and identity headers) and returns every problem as Errors, with paths relative
// to the rule ("id", "match.path"), or nil.
func (r *Rule) Validate() error {
	var v validator
	v.rule(r, "", nil)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

func (v *validator) policy(p *Policy) {
	switch {
	case p.Name == "":
		v.add("policy", "required")
	case !ValidName(p.Name):
		v.add("policy", identRule)
	}
	if p.Identity.UserHeader != "" && !ValidHeaderName(p.Identity.UserHeader) {
		v.add("identity.user_header", headerNameRule)
	}
	if p.Identity.TenantHeader != "" && !ValidHeaderName(p.Identity.TenantHeader) {
		v.add("identity.tenant_header", headerNameRule)
	}
	v.exempt(&p.Exempt, "exempt")
	if rh := p.ResponseHeaders; rh != nil {
		switch rh.Set {
		case HeadersXRateLimit, HeadersRateLimit, HeadersBoth, HeadersNone:
		case "":
			v.add("response_headers.set", "required")
		default:
			v.add("response_headers.set", "must be one of x-ratelimit, ratelimit, both, none; got "+quoteClipped(rh.Set))
		}
	}
	if len(p.Rules) > MaxRules {
		v.add("rules", "at most "+strconv.Itoa(MaxRules)+" rules, got "+strconv.Itoa(len(p.Rules)))
		return
	}
	seen := make(map[string]int, len(p.Rules))
	var paths map[string]int
	for i := range p.Rules {
		r := &p.Rules[i]
		field := elemPath("rules", i)
		v.rule(r, field, &p.Identity)
		if r.Descriptor != nil {
			if paths == nil {
				paths = make(map[string]int)
			}
			path := descriptorPath(r.Descriptor)
			if j, dup := paths[path]; dup {
				v.add(field+".descriptor", "the same domain and entries as rules["+strconv.Itoa(j)+"] (one descriptor, one rule)")
			} else {
				paths[path] = i
			}
		}
		if r.ID == "" {
			continue
		}
		if j, dup := seen[r.ID]; dup {
			v.add(field+".id", "duplicate rule id "+quoteClipped(r.ID)+" (also rules["+strconv.Itoa(j)+"])")
			continue
		}
		seen[r.ID] = i
	}
	for i := range p.Rules {
		ds := p.Rules[i].Descriptor
		if ds == nil {
			continue
		}
		for k, id := range ds.Replaces {
			if j, ok := seen[id]; !ok || p.Rules[j].Descriptor == nil {
				v.add(elemPath(elemPath("rules", i)+".descriptor.replaces", k), "must be the id of a descriptor rule of this policy, got "+quoteClipped(id))
			}
		}
	}
}

func (v *validator) exempt(e *Exempt, field string) {
	if n := len(e.CIDRs); n > MaxExemptEntries {
		v.add(field+".cidrs", "at most "+strconv.Itoa(MaxExemptEntries)+" entries, got "+strconv.Itoa(n))
	} else {
		for i, s := range e.CIDRs {
			if _, msg := parseCIDR(s); msg != "" {
				v.add(elemPath(field+".cidrs", i), msg)
			}
		}
	}
	v.idList(e.Users, field+".users")
	v.idList(e.Tenants, field+".tenants")
}

func (v *validator) idList(list []string, field string) {
	if n := len(list); n > MaxExemptEntries {
		v.add(field, "at most "+strconv.Itoa(MaxExemptEntries)+" entries, got "+strconv.Itoa(n))
		return
	}
	for i, s := range list {
		if s == "" || len(s) > MaxExemptIDBytes || !utf8.ValidString(s) {
			v.add(elemPath(field, i), "must be 1 to "+strconv.Itoa(MaxExemptIDBytes)+" bytes of UTF-8")
		}
	}
}

// parseCIDR parses an Exempt CIDR entry; msg is "" on success.
func parseCIDR(s string) (p netip.Prefix, msg string) {
	const want = "must be an IP prefix such as 10.0.0.0/8 or an IP address"
	if len(s) > 64 {
		return p, want
	}
	var err error
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			p, err = netip.ParsePrefix(s)
			if err != nil {
				return p, want
			}
			if m := p.Masked(); m != p {
				return p, "has bits set beyond the prefix length; write " + m.String()
			}
			return p, ""
		}
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return p, want
	}
	return netip.PrefixFrom(a, a.BitLen()), ""
}

// rule validates r; id is the policy's identity, nil when validating a rule alone.
func (v *validator) rule(r *Rule, field string, id *Identity) {
	f := func(name string) string { return join(field, name) }
	switch {
	case r.ID == "":
		v.add(f("id"), "required")
	case !ValidID(r.ID):
		v.add(f("id"), identRule)
	}
	if len(r.Description) > MaxDescriptionBytes || !utf8.ValidString(r.Description) {
		v.add(f("description"), "must be at most "+strconv.Itoa(MaxDescriptionBytes)+" bytes of UTF-8")
	}
	if r.Descriptor != nil {
		v.descriptor(r, field)
	}
	if !r.Match.isZero() {
		v.match(&r.Match, f("match"))
	}
	if len(r.Key) > 0 {
		v.key(r.Key, f("key"), id)
	}

	if r.Descriptor != nil && r.Descriptor.Passes() {
		return // no limit to check (descriptor says what it may have)
	}
	if r.Limit == 0 && r.Descriptor != nil && !r.AlwaysOver() {
		v.add(f("limit"), `0 only with descriptor, without "http", and fixed_window (a descriptor always over its limit)`)
	}
	// Algorithm and its parameters: the bounds are package limit's.
	cfg, ok := v.limitConfig(r, field)
	if ok {
		if err := cfg.Validate(); err != nil {
			var ce *limit.ConfigError
			if errors.As(err, &ce) {
				param := ce.Param
				if param == "calendar_day" {
					param = "align"
				}
				v.add(f(param), ce.Reason)
			} else {
				v.add(f("algorithm"), err.Error())
			}
		}
	}

	// Cost.
	if r.Cost > MaxCost {
		v.add(f("cost"), "must be <= "+strconv.FormatUint(MaxCost, 10))
	}
	if r.CostHeader != "" {
		if !ValidHeaderName(r.CostHeader) {
			v.add(f("cost_header"), headerNameRule)
		}
		switch {
		case r.MaxCost == 0:
			v.add(f("max_cost"), "required with cost_header")
		case r.MaxCost > MaxCost:
			v.add(f("max_cost"), "must be <= "+strconv.FormatUint(MaxCost, 10))
		}
	} else if r.MaxCost != 0 {
		v.add(f("max_cost"), "only with cost_header")
	}
	if r.ResponseCostHeader != "" {
		if !ValidHeaderName(r.ResponseCostHeader) {
			v.add(f("response_cost_header"), headerNameRule)
		} else if r.Algorithm == "sliding_log" || r.Algorithm == "concurrency" {
			v.add(f("response_cost_header"), "not supported by "+r.Algorithm+" (its state cannot be corrected after the fact)")
		}
	}
	if r.Status != 0 && (r.Status < MinStatus || r.Status > MaxStatus) {
		v.add(f("status"), "must be between 400 and 599")
	}
	if len(r.Exempt.CIDRs)+len(r.Exempt.Users)+len(r.Exempt.Tenants) > 0 {
		v.exempt(&r.Exempt, f("exempt"))
	}
	v.scope(r, field, cfg, ok && cfg.Validate() == nil)
}

// limitConfig maps a rule's algorithm fields onto a limit.Config, adding errors for
// what limit.Config cannot express (unknown names, a bad time zone). ok is false when
// the algorithm is unknown, so Config.Validate is not worth running.
func (v *validator) limitConfig(r *Rule, field string) (cfg limit.Config, ok bool) {
	f := func(name string) string { return join(field, name) }
	alg, known := limit.ParseAlgorithm(r.Algorithm)
	switch {
	case r.Algorithm == "":
		v.add(f("algorithm"), "required")
	case !known:
		v.add(f("algorithm"), "unknown algorithm "+quoteClipped(r.Algorithm)+"; want token_bucket, time_wheel, fixed_window, gcra, sliding_log or concurrency")
	}
	cfg = limit.Config{
		Algorithm: alg,
		Limit:     r.Limit,
		Window:    r.Window,
		Burst:     r.Burst,
		Slots:     r.Slots,
		Lease:     r.Lease,
	}
	switch r.Align {
	case "":
	case "calendar_day":
		cfg.CalendarDay = true
	default:
		v.add(f("align"), `must be "calendar_day"`)
	}
	if r.Timezone != "" {
		loc, msg := loadLocation(r.Timezone)
		if msg != "" {
			v.add(f("timezone"), msg)
		} else {
			cfg.Location = loc
		}
	}
	if r.Limit == 0 && r.AlwaysOver() {
		// Every descriptor is over a limit of 0: the limiter compiled for the
		// rule is a placeholder the rate limit service never consults.
		cfg.Limit = 1
	}
	return cfg, known
}

// loadLocation loads an IANA time zone from the slim zones embedded here
// (LoadZone). "Local" and "" are refused: the filter's local zone is not
// something a policy can know.
func loadLocation(name string) (*time.Location, string) {
	loc, err := LoadZone(name)
	if err != nil {
		return nil, "unknown time zone " + quoteClipped(name) + " (want an IANA name such as Europe/Berlin)"
	}
	return loc, ""
}

func (v *validator) match(m *Match, field string) {
	f := func(name string) string { return join(field, name) }
	if m.Path != "" && m.PathPrefix != "" {
		v.add(f("path_prefix"), "not allowed with path (use one of them)")
	}
	if m.Path != "" {
		if msg := checkPath(m.Path); msg != "" {
			v.add(f("path"), msg)
		}
	}
	if m.PathPrefix != "" {
		if msg := checkPath(m.PathPrefix); msg != "" {
			v.add(f("path_prefix"), msg)
		}
	}
	if n := len(m.Methods); n > MaxMethods {
		v.add(f("methods"), "at most "+strconv.Itoa(MaxMethods)+" methods, got "+strconv.Itoa(n))
	} else {
		for i, meth := range m.Methods {
			mf := func() string { return elemPath(f("methods"), i) }
			if !validMethod(meth) {
				v.add(mf(), "must be an upper-case HTTP method such as GET (RFC 9110 §9, case-sensitive)")
				continue
			}
			for j := 0; j < i; j++ {
				if m.Methods[j] == meth {
					v.add(mf(), "duplicate method "+quoteClipped(meth))
					break
				}
			}
		}
	}
	if n := len(m.Headers); n > MaxHeaderMatches {
		v.add(f("headers"), "at most "+strconv.Itoa(MaxHeaderMatches)+" conditions, got "+strconv.Itoa(n))
		return
	}
	for i := range m.Headers {
		h := &m.Headers[i]
		hf := func() string { return elemPath(f("headers"), i) }
		if h.Name == "" {
			v.add(hf()+".name", "required")
		} else if !ValidHeaderName(h.Name) {
			v.add(hf()+".name", headerNameRule)
		}
		n := 0
		if h.Exact != "" {
			n++
			if msg := checkHeaderValue(h.Exact); msg != "" {
				v.add(hf()+".exact", msg)
			}
		}
		if h.Prefix != "" {
			n++
			if msg := checkHeaderValue(h.Prefix); msg != "" {
				v.add(hf()+".prefix", msg)
			}
		}
		if h.Present {
			n++
		}
		if h.Absent {
			n++
		}
		if n != 1 {
			v.add(hf(), "needs exactly one of exact, prefix, present: true, absent: true")
		}
	}
}

func checkPath(p string) string {
	if len(p) > MaxPathBytes {
		return "must be at most " + strconv.Itoa(MaxPathBytes) + " bytes"
	}
	if p[0] != '/' {
		return "must start with '/'"
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '?' || c == '#':
			return "must not contain a query or fragment ('?', '#'): paths are matched without the query"
		case c <= ' ' || c == 0x7f:
			return "must not contain spaces or control characters"
		}
	}
	if !utf8.ValidString(p) {
		return "must be valid UTF-8"
	}
	return ""
}

// checkHeaderValue applies RFC 9110 §5.5: field values hold no CR, LF or NUL; sluice
// also refuses other control characters except tab.
func checkHeaderValue(s string) string {
	if len(s) > MaxHeaderValueBytes {
		return "must be at most " + strconv.Itoa(MaxHeaderValueBytes) + " bytes"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return "must not contain control characters (RFC 9110 §5.5)"
		}
	}
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	return ""
}

func (v *validator) key(parts []string, field string, id *Identity) {
	if n := len(parts); n > MaxKeyParts {
		v.add(field, "at most "+strconv.Itoa(MaxKeyParts)+" parts, got "+strconv.Itoa(n))
		return
	}
	for i, s := range parts {
		pf := func() string { return elemPath(field, i) }
		alts, msg := parseKeyPart(s)
		if msg != "" {
			v.add(pf(), msg)
			continue
		}
		for j := 0; j < i; j++ {
			if parts[j] == s {
				v.add(pf(), "duplicate key part "+quoteClipped(s))
				break
			}
		}
		if id == nil {
			continue
		}
		for _, a := range alts {
			if a.kind == partUser && id.UserHeader == "" {
				v.add(pf(), `"user" needs identity.user_header`)
			}
			if a.kind == partTenant && id.TenantHeader == "" {
				v.add(pf(), `"tenant" needs identity.tenant_header`)
			}
		}
	}
}
