package quota

import (
	"errors"
	"strconv"
	"strings"
)

// ErrXFCC is wrapped by every error XFCCIdentity returns: the header is absent,
// malformed, or names no identity. A caller treats the request as carrying no
// identity at all (401), never as carrying part of one.
var ErrXFCC = errors.New("x-forwarded-client-cert")

// xfccKeys are the keys Envoy writes into an element, lower-cased (Envoy's
// "x-forwarded-client-cert" header documentation; the writer is
// ConnectionManagerUtility::mutateXfccRequestHeader in
// source/common/http/conn_manager_utility.cc).
var xfccKeys = map[string]bool{"by": true, "hash": true, "cert": true, "chain": true, "subject": true, "uri": true, "dns": true}

// XFCCIdentity returns the identity in x-forwarded-client-cert header values: the
// first non-empty URI of the last element (the one the nearest proxy appended),
// else its first non-empty DNS.
//
// The header is parsed as Envoy writes it, and all of it must parse: several
// values are one header joined with "," (RFC 9110 §5.3; Envoy coalesces the
// header the same way before it appends); elements are separated by "," and
// pairs by ";" outside double quotes; a quoted value is exactly one quoted string
// in which a backslash escapes the next byte; an unquoted value holds no quote;
// every key is one Envoy documents (By, Hash, Cert, Chain, Subject, URI, DNS;
// case-insensitive). An unterminated quote, an empty element or pair, an unknown
// key or a stray quote makes the whole header invalid: the error wraps ErrXFCC.
//
// Why all of it: with forward_client_cert_details APPEND_FORWARD the trusted hop
// appends its element after whatever the client sent. The client's prefix can
// open a quote that swallows the separators of that element (the quotes of an
// Envoy element come in pairs, so the scan ends inside a quote), or end in a
// value whose closing quote is the element's; read leniently, either makes the
// client's claim the last element. Read strictly, such a header is refused and
// the element the trusted hop appended is the only identity that can come out.
func XFCCIdentity(values []string) (string, error) {
	if len(values) == 0 {
		return "", xfccError("the header is absent")
	}
	elems, why := splitOutsideQuotes(strings.Join(values, ","), ',')
	if why != "" {
		return "", xfccError(why)
	}
	var uri, dns string
	for i, e := range elems {
		pairs, why := splitOutsideQuotes(e, ';')
		if why != "" {
			return "", xfccError("element " + strconv.Itoa(i+1) + ": " + why)
		}
		last := i == len(elems)-1
		for _, p := range pairs {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				return "", xfccError("element " + strconv.Itoa(i+1) + " has a part without \"=\"")
			}
			k = strings.ToLower(strings.TrimSpace(k))
			if !xfccKeys[k] {
				return "", xfccError("element " + strconv.Itoa(i+1) + " has a key Envoy does not write")
			}
			v, ok = xfccValue(strings.TrimSpace(v))
			if !ok {
				return "", xfccError("element " + strconv.Itoa(i+1) + " has a malformed value of " + k)
			}
			switch {
			case !last || v == "":
			case k == "uri" && uri == "":
				uri = v
			case k == "dns" && dns == "":
				dns = v
			}
		}
	}
	switch {
	case uri != "":
		return uri, nil
	case dns != "":
		return dns, nil
	}
	return "", xfccError("the last element has neither a URI nor a DNS")
}

func xfccError(why string) error {
	return errors.Join(ErrXFCC, errors.New(why))
}

// splitOutsideQuotes splits s at sep outside double quotes, in which a backslash
// escapes the next byte. It says why it cannot: a quote is not terminated, or a
// part is empty (after trimming spaces and tabs).
func splitOutsideQuotes(s string, sep byte) (parts []string, why string) {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	out = append(out, s[start:])
	if quoted {
		return nil, "a quote is not terminated"
	}
	for _, p := range out {
		if strings.Trim(p, " \t") == "" {
			return nil, "a part between separators is empty"
		}
	}
	return out, ""
}

// xfccValue returns a value unquoted: a quoted one must be one quoted string from
// its first byte to its last, an unquoted one must hold no quote.
func xfccValue(v string) (string, bool) {
	if !strings.HasPrefix(v, `"`) {
		return v, !strings.Contains(v, `"`)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' && i+1 < len(v):
			i++
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), i == len(v)-1
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}
