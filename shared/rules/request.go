package rules

import (
	"net/netip"
	"slices"
	"strings"
)

// Request is what matching and key building need to know about an HTTP request. The
// filter fills it once per request; nothing here retains it.
type Request struct {
	// Method is the request method as sent (":method"), e.g. "GET".
	Method string
	// Path is the request path without the query string or fragment (see PathOnly),
	// e.g. "/v1/auth/login"; it is compared byte for byte, without decoding or
	// normalisation (Envoy's normalize_path and merge_slashes act before filters).
	Path string
	// Headers are the request headers with lower-case names, as Envoy hands them to
	// filters (pseudo-headers such as ":authority" included). For a repeated header
	// the first occurrence counts.
	Headers []Header
	// ClientIP is the client address as the filter determined it (from the downstream
	// connection or a trusted X-Forwarded-For hop; that choice is the filter's).
	// IPv4-mapped IPv6 addresses are treated as IPv4. The zero Addr means unknown: the
	// client_ip key part is then missing and CIDR exemptions do not apply.
	ClientIP netip.Addr
	// ClientIPSource, when not nil, supplies ClientIP on first use: while ClientIP is
	// the zero Addr, the first CIDR exemption or client_ip key part that needs the
	// address calls it, once per Request, and keeps its result in ClientIP. A filter
	// sets it so that a request decided without the address (a key "user|client_ip"
	// with the user present, say) never pays for reading it.
	ClientIPSource func() netip.Addr
	// ipSourced records that ClientIPSource was called.
	ipSourced bool
	// User and Tenant are the caller's ids. When empty, the policy's identity headers
	// (identity.user_header, identity.tenant_header) are read from Headers instead, so
	// a filter may leave them empty or set them from elsewhere (JWT metadata, say).
	User   string
	Tenant string
	// Descriptor is, for a descriptor rule (Rule.Descriptor) only, the rate limit
	// descriptor's entries in order, Name holding each entry's key; a rule's counter
	// key takes the values of the entries it does not match exactly by position.
	Descriptor []Header
}

// clientIP returns ClientIP, first asking ClientIPSource for it if need be.
func (r *Request) clientIP() netip.Addr {
	if !r.ClientIP.IsValid() && r.ClientIPSource != nil && !r.ipSourced {
		r.ipSourced = true
		r.ClientIP = r.ClientIPSource()
	}
	return r.ClientIP
}

// SetPart sets the value the key part part (one alternative of Rule.Key,
// "route" aside) reads: the user, tenant, method, path (PathOnly applied),
// client address or a header (its name lower-cased), for a request known by
// its key values rather than its headers (an RLQS bucket id, a rate limit
// descriptor). known is false for an unknown part or header name; valid is
// false when a client_ip value is no IP address.
func (r *Request) SetPart(part, value string) (known, valid bool) {
	switch part {
	case "user":
		r.User = value
	case "tenant":
		r.Tenant = value
	case "method":
		r.Method = value
	case "path":
		r.Path = PathOnly(value)
	case "client_ip":
		ip, err := netip.ParseAddr(value)
		if err != nil {
			return true, false
		}
		r.ClientIP = ip
	default:
		name, ok := strings.CutPrefix(part, "header:")
		if !ok || !ValidHeaderName(name) {
			return false, false
		}
		r.Headers = append(r.Headers, Header{Name: strings.ToLower(name), Value: value})
	}
	return true, true
}

// Header is one request header field.
type Header struct {
	// Name is the header name in lower case.
	Name string
	// Value is the field value.
	Value string
}

// Header returns the value of the first header named name (lower case) and whether
// there is one.
func (r *Request) Header(name string) (string, bool) {
	for i := range r.Headers {
		if r.Headers[i].Name == name {
			return r.Headers[i].Value, true
		}
	}
	return "", false
}

// PathOnly returns the path part of a request target ":path", cut at the first '?'
// or '#': PathOnly("/a/b?x=1") is "/a/b". It does not allocate.
func PathOnly(target string) string {
	// A loop, not strings.IndexAny: IndexAny builds its byte set on every
	// call, which on a request path of a few bytes costs more than the scan.
	for i := 0; i < len(target); i++ {
		if c := target[i]; c == '?' || c == '#' {
			return target[:i]
		}
	}
	return target
}

// user returns the request's user id: Request.User, or the identity header.
func (c *Compiled) user(req *Request) string {
	if req.User != "" || c.userHeader == "" {
		return req.User
	}
	v, _ := req.Header(c.userHeader)
	return v
}

// tenant returns the request's tenant id: Request.Tenant, or the identity header.
func (c *Compiled) tenant(req *Request) string {
	if req.Tenant != "" || c.tenantHeader == "" {
		return req.Tenant
	}
	v, _ := req.Header(c.tenantHeader)
	return v
}

// matcher is a compiled Match.
type matcher struct {
	never   bool // a descriptor rule: no HTTP request matches
	path    string
	hasPath bool
	prefix  bool
	methods []string
	headers []HeaderMatch
}

// equal reports whether m and o hold for the same requests because they are
// the same conditions (slices.Equal on the methods and header matches).
func (m *matcher) equal(o *matcher) bool {
	return m.never == o.never && m.path == o.path && m.hasPath == o.hasPath && m.prefix == o.prefix &&
		slices.Equal(m.methods, o.methods) && slices.Equal(m.headers, o.headers)
}

func (m *matcher) matches(req *Request) bool {
	if m.never {
		return false
	}
	if m.hasPath {
		if m.prefix {
			if !strings.HasPrefix(req.Path, m.path) {
				return false
			}
		} else if req.Path != m.path {
			return false
		}
	}
	if len(m.methods) > 0 {
		found := false
		for _, meth := range m.methods {
			if meth == req.Method {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for i := range m.headers {
		h := &m.headers[i]
		v, ok := req.Header(h.Name)
		switch {
		case h.Absent:
			if ok {
				return false
			}
		case !ok:
			return false
		case h.Exact != "":
			if v != h.Exact {
				return false
			}
		case h.Prefix != "":
			if !strings.HasPrefix(v, h.Prefix) {
				return false
			}
		}
	}
	return true
}

// Exempt reports whether the request is exempt from the whole policy (policy-level
// exempt: client IP in a CIDR, user or tenant listed).
func (c *Compiled) Exempt(req *Request) bool {
	if c.exempt.empty() {
		return false
	}
	return c.exempt.contains(req, c.user(req), c.tenant(req))
}

// RuleExempt reports whether the request is exempt from rule i by the rule's own
// exempt list (the policy's is not consulted).
func (c *Compiled) RuleExempt(i int, req *Request) bool {
	e := &c.rules[i].exempt
	if e.empty() {
		return false
	}
	return e.contains(req, c.user(req), c.tenant(req))
}

// Matches reports whether rule i's match conditions hold for the request,
// exemptions aside.
func (c *Compiled) Matches(i int, req *Request) bool { return c.rules[i].match.matches(req) }

// Match appends to out the indices, in policy order, of the rules that apply to the
// request: their match conditions hold and the request is exempt neither from the
// policy nor from the rule. It returns out unchanged when the request is exempt from
// the policy. It does not allocate when out has room for every rule (make([]int, 0,
// c.Len())).
func (c *Compiled) Match(req *Request, out []int) []int {
	if len(c.rules) == 0 || c.Exempt(req) {
		return out
	}
	// held has bit k set when rule k's match conditions held (k < 64): a rule
	// whose conditions equal an earlier one's takes its answer from there.
	var held uint64
	for i := range c.rules {
		r := &c.rules[i]
		var ok bool
		if k := r.matchClass; k != i && k < 64 {
			ok = held&(1<<k) != 0
		} else {
			ok = r.match.matches(req)
		}
		if !ok {
			continue
		}
		if i < 64 {
			held |= 1 << i
		}
		if r.exempt.empty() || !c.RuleExempt(i, req) {
			out = append(out, i)
		}
	}
	return out
}
