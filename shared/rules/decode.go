package rules

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// ParsePolicy decodes a policy document strictly (RFC 8259 JSON, valid UTF-8, at
// most MaxPolicyBytes bytes, no duplicate keys, no unknown fields, no trailing data;
// null is accepted for any member and means "absent") and validates it as
// [Policy.Validate] does. On any problem it returns a nil policy and an Errors listing
// every problem found, each with its JSON path; malformed JSON is reported at the
// path where it broke ("" for the top level), and decoding stops there. It is
// DecodePolicy(doc).Validate().
func ParsePolicy(doc []byte) (*Policy, error) {
	return DecodePolicy(doc).Validate()
}

// Document is a policy document read by [DecodePolicy]: its structure and types
// checked, its meaning not yet. A caller may complete the policy before validating
// it, as the control plane does with the name in the request's path.
type Document struct {
	// Policy holds what was decoded. A member whose value had the wrong type or range
	// is left zero (its problem is kept for Validate); after malformed JSON it holds
	// what came before the break.
	Policy Policy

	errs    Errors   // decoding problems, in document order
	syntax  bool     // decoding stopped at malformed JSON
	object  bool     // the document is a JSON object
	present []string // top-level members present with a value other than null
}

// DecodePolicy reads a policy document with the strictness of [ParsePolicy] but does
// not check its meaning: it never fails, and what it found wrong waits in the
// Document for [Document.Validate].
func DecodePolicy(doc []byte) *Document {
	d := strictjson.NewDecoder(doc, strictjson.Limits{MaxBytes: MaxPolicyBytes, MaxDepth: MaxDepth})
	out := &Document{object: d.Peek() == strictjson.Object}
	_ = d.Object(func(key string) error {
		if d.Peek() != strictjson.Null {
			out.present = append(out.present, key)
		}
		return decodePolicyMember(d, &out.Policy, key)
	})
	_ = d.End()
	for _, e := range d.Errors() {
		out.errs = append(out.errs, FieldError{Field: e.Path, Message: e.Message, Decoding: true, Offset: e.Offset})
		out.syntax = out.syntax || e.Syntax
	}
	return out
}

// Missing reports whether the document is a well-formed JSON object without the
// top-level member name, or with it null (which decodes as absent). After malformed
// JSON, or for a document that is not an object, it reports false: what is missing
// is not known.
func (d *Document) Missing(name string) bool {
	if d.syntax || !d.object {
		return false
	}
	for _, k := range d.present {
		if k == name {
			return false
		}
	}
	return true
}

// Validate returns the policy, or nil and an Errors listing every problem: the
// decoding problems in document order, then the problems of meaning ([Policy.Validate])
// except those about a value that already failed to decode. After malformed JSON only
// the decoding problems are reported.
func (d *Document) Validate() (*Policy, error) {
	errs := combine(append(Errors(nil), d.errs...), d.syntax, func(v *validator) { v.policy(&d.Policy) })
	if errs != nil {
		return nil, errs
	}
	p := d.Policy
	return &p, nil
}

// ParseRule decodes and validates one rule object, as sent to the control plane's
// rule endpoints, with at most MaxRuleBytes bytes. field is the JSON path the rule
// will have, prefixed to every error path: "" gives "id", "rules[3]" gives
// "rules[3].id". It validates what the rule alone can show ([Rule.Validate]);
// duplicate ids and identity headers are checked by [Policy.Validate] on the policy
// the rule goes into.
func ParseRule(doc []byte, field string) (*Rule, error) {
	d := strictjson.NewDecoder(doc, strictjson.Limits{MaxBytes: MaxRuleBytes, MaxDepth: MaxDepth})
	r := new(Rule)
	_ = d.Object(func(key string) error { return decodeRuleMember(d, r, key) })
	_ = d.End()
	errs := finish(d, field, func(v *validator) { v.rule(r, field, nil) })
	if errs != nil {
		return nil, errs
	}
	return r, nil
}

// finish turns the decoder's errors into Errors (paths prefixed by field) and
// combines them with the validation errors.
func finish(d *strictjson.Decoder, field string, validate func(*validator)) Errors {
	var errs Errors
	syntax := false
	for _, e := range d.Errors() {
		errs = append(errs, FieldError{Field: join(field, e.Path), Message: e.Message, Decoding: true, Offset: e.Offset})
		syntax = syntax || e.Syntax
	}
	return combine(errs, syntax, validate)
}

// combine adds to the decoding problems errs, if the document was well-formed, the
// validation errors, except those about a value that already failed to decode. It
// returns nil when there is no problem.
func combine(errs Errors, syntax bool, validate func(*validator)) Errors {
	if syntax {
		return errs
	}
	var v validator
	validate(&v)
	for _, ve := range v.errs {
		if len(errs) >= MaxErrors {
			errs = append(errs, FieldError{Message: tooMany})
			break
		}
		if ve.Message == tooMany || !covered(errs, ve.Field) {
			errs = append(errs, ve)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// covered reports whether field is, or is inside, a field that already has an error.
func covered(errs Errors, field string) bool {
	for _, e := range errs {
		if field == e.Field || e.Field == "" {
			return true
		}
		if strings.HasPrefix(field, e.Field) && len(field) > len(e.Field) {
			if c := field[len(e.Field)]; c == '.' || c == '[' {
				return true
			}
		}
	}
	return false
}

func decodePolicyMember(d *strictjson.Decoder, p *Policy, key string) error {
	switch key {
	case "policy":
		p.Name = str(d)
	case "version":
		p.Version, _ = readUint64(d)
	case "identity":
		if d.Null() {
			return nil
		}
		return d.Object(func(key string) error {
			switch key {
			case "user_header":
				p.Identity.UserHeader = str(d)
			case "tenant_header":
				p.Identity.TenantHeader = str(d)
			}
			return nil
		})
	case "exempt":
		return decodeExempt(d, &p.Exempt)
	case "response_headers":
		if d.Null() {
			return nil
		}
		rh := new(ResponseHeaders)
		p.ResponseHeaders = rh
		return d.Object(func(key string) error {
			switch key {
			case "set":
				rh.Set = str(d)
			case "on_allow":
				rh.OnAllow, _ = boolean(d)
			}
			return nil
		})
	case "rules":
		if d.Null() {
			return nil
		}
		var rules []Rule
		err := d.Array(func(int) error {
			rules = append(rules, Rule{})
			r := &rules[len(rules)-1]
			return d.Object(func(key string) error { return decodeRuleMember(d, r, key) })
		})
		if len(rules) > 0 {
			p.Rules = rules
		}
		return err
	}
	return nil
}

func decodeExempt(d *strictjson.Decoder, e *Exempt) error {
	if d.Null() {
		return nil
	}
	return d.Object(func(key string) error {
		switch key {
		case "cidrs":
			e.CIDRs = strList(d)
		case "users":
			e.Users = strList(d)
		case "tenants":
			e.Tenants = strList(d)
		}
		return nil
	})
}

func decodeRuleMember(d *strictjson.Decoder, r *Rule, key string) error {
	switch key {
	case "id":
		r.ID = str(d)
	case "description":
		r.Description = str(d)
	case "descriptor":
		return decodeDescriptor(d, r)
	case "match":
		if d.Null() {
			return nil
		}
		return d.Object(func(key string) error { return decodeMatchMember(d, &r.Match, key) })
	case "key":
		r.Key = strList(d)
	case "algorithm":
		r.Algorithm = str(d)
	case "limit":
		if !d.Null() {
			r.Limit, _ = d.CountUint64() // "must be > 0" for -5 as for 0
		}
	case "window":
		r.Window, _ = dur(d)
	case "burst":
		r.Burst, _ = readUint64(d)
	case "slots":
		if v, err := readUint64(d); err == nil {
			if v > uint64(limit.MaxSlots) {
				d.Fail("must be <= " + strconv.Itoa(int(limit.MaxSlots)) + ", got " + strconv.FormatUint(v, 10))
			} else {
				r.Slots = uint32(v)
			}
		}
	case "align":
		r.Align = str(d)
	case "timezone":
		r.Timezone = str(d)
	case "lease":
		r.Lease, _ = dur(d)
	case "cost":
		if v, err := readUint64(d); err == nil {
			if v == 0 {
				d.Fail("must be >= 1 (omit it for the default of 1)")
			}
			r.Cost = v
		}
	case "cost_header":
		r.CostHeader = str(d)
	case "max_cost":
		r.MaxCost, _ = readUint64(d)
	case "response_cost_header":
		r.ResponseCostHeader = str(d)
	case "shadow":
		r.Shadow, _ = boolean(d)
	case "status":
		if v, err := readUint64(d); err == nil {
			if v < MinStatus || v > MaxStatus {
				d.Fail("must be between 400 and 599")
			} else {
				r.Status = int(v)
			}
		}
	case "exempt":
		return decodeExempt(d, &r.Exempt)
	case "scope":
		r.Scope = str(d)
	case "on_quota_failure":
		r.OnQuotaFailure = str(d)
	case "local_share":
		if num, err := d.Number(); err == nil {
			if v, ok := parsePermille(num); ok {
				r.LocalSharePermille = v
			} else {
				d.Fail("must be a number greater than 0 and at most 1, with at most three decimals, got " + num)
			}
		}
	}
	return nil
}

func decodeMatchMember(d *strictjson.Decoder, m *Match, key string) error {
	switch key {
	case "path_prefix":
		m.PathPrefix = str(d)
		if m.PathPrefix == "" {
			d.Fail("must not be empty (omit it to match every path)")
		}
	case "path":
		m.Path = str(d)
		if m.Path == "" {
			d.Fail("must not be empty (omit it to match every path)")
		}
	case "methods":
		m.Methods = strList(d)
	case "headers":
		if d.Null() {
			return nil
		}
		var hs []HeaderMatch
		err := d.Array(func(int) error {
			hs = append(hs, HeaderMatch{})
			h := &hs[len(hs)-1]
			return d.Object(func(key string) error {
				switch key {
				case "name":
					h.Name = str(d)
				case "exact":
					h.Exact = str(d)
					if h.Exact == "" {
						d.Fail("must not be empty (use present: true)")
					}
				case "prefix":
					h.Prefix = str(d)
					if h.Prefix == "" {
						d.Fail("must not be empty (use present: true)")
					}
				case "present":
					h.Present = boolTrue(d, "must be true when given (use absent: true to match requests without the header)")
				case "absent":
					h.Absent = boolTrue(d, "must be true when given (use present: true to match requests with the header)")
				}
				return nil
			})
		})
		if len(hs) > 0 {
			m.Headers = hs
		}
		return err
	}
	return nil
}

func boolTrue(d *strictjson.Decoder, msg string) bool {
	if d.Null() {
		return false
	}
	v, err := d.Bool()
	if err == nil && !v {
		d.Fail(msg)
	}
	return v
}

// The readers below treat null as absent (the zero value). A value error is recorded
// by the decoder and yields the zero value too.

func str(d *strictjson.Decoder) string {
	if d.Null() {
		return ""
	}
	s, _ := d.String()
	return s
}

func readUint64(d *strictjson.Decoder) (uint64, error) {
	if d.Null() {
		return 0, errNull
	}
	return d.Uint64()
}

func dur(d *strictjson.Decoder) (time.Duration, error) {
	if d.Null() {
		return 0, errNull
	}
	return d.Duration()
}

func boolean(d *strictjson.Decoder) (bool, error) {
	if d.Null() {
		return false, errNull
	}
	return d.Bool()
}

// errNull tells a caller of u64, dur or boolean that the value was null (absent).
var errNull = &strictjson.Error{Message: "null"}

// strList reads an array of strings; nil for null or an empty array.
func strList(d *strictjson.Decoder) []string {
	if d.Null() {
		return nil
	}
	var out []string
	_ = d.Array(func(int) error {
		s, err := d.String()
		if err == nil {
			out = append(out, s)
		} else {
			out = append(out, "")
		}
		return nil
	})
	if len(out) == 0 {
		return nil
	}
	return out
}
