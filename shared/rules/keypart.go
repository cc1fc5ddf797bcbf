package rules

import (
	"slices"
	"strconv"
	"strings"
)

// partKind is one source of a key value.
type partKind uint8

const (
	partClientIP partKind = iota + 1
	partUser
	partTenant
	partRoute
	partMethod
	partPath
	partHeader
	partDescriptor
)

// keyAlt is one alternative of a key part.
type keyAlt struct {
	kind   partKind
	header string // partHeader: the header name
	entry  int    // partDescriptor: the index of the descriptor entry
	tag    string // the tag written before the value in the counter key, escaped
}

const keyPartRule = "want client_ip, user, tenant, route, method, path or header:<name>, or alternatives joined by '|'"

// parseKeyPart parses one element of Rule.Key; msg is "" on success.
func parseKeyPart(s string) (alts []keyAlt, msg string) {
	if s == "" {
		return nil, "empty key part; " + keyPartRule
	}
	n := strings.Count(s, "|") + 1
	if n > MaxKeyAlternatives {
		return nil, "at most " + strconv.Itoa(MaxKeyAlternatives) + " alternatives"
	}
	alts = make([]keyAlt, 0, n)
	for _, one := range strings.Split(s, "|") {
		a, ok := parseKeyAlt(one)
		if !ok {
			if len(one) > 64 {
				one = one[:64] + "..."
			}
			return nil, "unknown key part " + quoteClipped(one) + "; " + keyPartRule
		}
		for _, b := range alts {
			if b == a {
				return nil, "duplicate alternative " + quoteClipped(one)
			}
		}
		alts = append(alts, a)
	}
	return alts, ""
}

func parseKeyAlt(s string) (keyAlt, bool) {
	switch s {
	case "client_ip":
		return keyAlt{kind: partClientIP, tag: "ip"}, true
	case "user":
		return keyAlt{kind: partUser, tag: "user"}, true
	case "tenant":
		return keyAlt{kind: partTenant, tag: "tenant"}, true
	case "route":
		return keyAlt{kind: partRoute, tag: "route"}, true
	case "method":
		return keyAlt{kind: partMethod, tag: "method"}, true
	case "path":
		return keyAlt{kind: partPath, tag: "path"}, true
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok && ValidHeaderName(name) {
		return keyAlt{kind: partHeader, header: name, tag: string(appendEscaped([]byte("h."), name))}, true
	}
	return keyAlt{}, false
}

// KeySources is what a rule's key reads from a request: whether any
// alternative of any key part reads each source, and the header names
// (header:<name>) they read, in key order, each once.
type KeySources struct {
	ClientIP, User, Tenant, Route, Method, Path bool
	Headers                                     []string
}

// KeySources returns what r's key (Rule.Key, as parsed by Compile) reads.
func (r *CompiledRule) KeySources() KeySources {
	var ks KeySources
	for _, alts := range r.parts {
		for _, a := range alts {
			switch a.kind {
			case partClientIP:
				ks.ClientIP = true
			case partUser:
				ks.User = true
			case partTenant:
				ks.Tenant = true
			case partRoute:
				ks.Route = true
			case partMethod:
				ks.Method = true
			case partPath:
				ks.Path = true
			case partHeader:
				if !slices.Contains(ks.Headers, a.header) {
					ks.Headers = append(ks.Headers, a.header)
				}
			}
		}
	}
	return ks
}
