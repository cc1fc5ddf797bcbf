package rules

// AppendKey appends the counter key of the request under rule i to dst and returns
// it with true; the format is in the package documentation. If a key part has no
// value (and none of its alternatives has one) the rule does not count the request:
// AppendKey returns dst unchanged and false. It does not allocate when dst has room
// for the key.
func (c *Compiled) AppendKey(dst []byte, i int, req *Request) ([]byte, bool) {
	r := &c.rules[i]
	if len(r.parts) == 0 {
		return append(dst, r.globalKey...), true
	}
	start := len(dst)
	dst = append(dst, r.keyPrefix...)
	for n, alts := range r.parts {
		if n > 0 {
			dst = append(dst, '|')
		}
		var ok bool
		for a := range alts {
			if dst, ok = c.appendPart(dst, &alts[a], r, req); ok {
				break
			}
		}
		if !ok {
			return dst[:start], false
		}
	}
	return append(dst, r.keySuffix...), true
}

// SameKeyParts reports whether rules i and j have the same key parts, so that
// for any request their counter keys differ only in the rule's prefix and
// period suffix (see the package documentation's key format) and
// AppendKeyLike can build one from the other. False for a rule without key
// parts.
func (c *Compiled) SameKeyParts(i, j int) bool {
	return c.rules[i].partsClass >= 0 && c.rules[i].partsClass == c.rules[j].partsClass
}

// AppendKeyLike appends to dst the counter key of a request under rule i,
// given key, the key AppendKey returned for the same request under rule j,
// where SameKeyParts(i, j): the key parts' values are copied from key rather
// than read and escaped again. The result equals what AppendKey(dst, i, req)
// returns. It does not allocate when dst has room for the key.
func (c *Compiled) AppendKeyLike(dst []byte, i int, key []byte, j int) []byte {
	r, o := &c.rules[i], &c.rules[j]
	dst = append(dst, r.keyPrefix...)
	dst = append(dst, key[len(o.keyPrefix):len(key)-len(o.keySuffix)]...)
	return append(dst, r.keySuffix...)
}

// appendPart appends "tag=value" for one alternative, or returns false (dst
// unchanged) when the request has no non-empty value for it.
func (c *Compiled) appendPart(dst []byte, a *keyAlt, r *CompiledRule, req *Request) ([]byte, bool) {
	var v string
	switch a.kind {
	case partClientIP:
		ip := req.clientIP()
		if !ip.IsValid() {
			return dst, false
		}
		dst = append(dst, a.tag...)
		dst = append(dst, '=')
		var tmp [64]byte
		return appendValue(dst, ip.Unmap().AppendTo(tmp[:0])), true
	case partRoute:
		dst = append(dst, a.tag...)
		dst = append(dst, '=')
		return append(dst, r.routeValue...), true
	case partUser:
		v = c.user(req)
	case partTenant:
		v = c.tenant(req)
	case partMethod:
		v = req.Method
	case partPath:
		v = req.Path
	case partHeader:
		v, _ = req.Header(a.header)
	case partDescriptor:
		if a.entry < len(req.Descriptor) {
			v = req.Descriptor[a.entry].Value
		}
	}
	if v == "" {
		return dst, false
	}
	dst = append(dst, a.tag...)
	dst = append(dst, '=')
	return appendValue(dst, v), true
}

// Cost returns what the request costs under rule i, in cost units, at least
// [MinCost]. Without a cost_header it is the rule's cost (default 1) and ok is
// true. With one, it is the header's value, a decimal integer (see ParseCost),
// clamped to MinCost..max_cost; ok is false when the header is missing or
// malformed, in which case the rule's cost is returned, or when the value was
// clamped: the caller should log and count that. A header of 0 thus costs 1: a
// client cannot make its requests free, nor take an unbounded number of
// concurrency slots.
func (c *Compiled) Cost(i int, req *Request) (cost uint64, ok bool) {
	r := &c.rules[i]
	if r.costHeader == "" {
		return r.cost, true
	}
	v, found := req.Header(r.costHeader)
	if !found {
		return r.cost, false
	}
	n, valid := ParseCost(v)
	if !valid {
		return r.cost, false
	}
	if n > r.maxCost {
		return r.maxCost, false
	}
	if n < MinCost {
		return MinCost, false
	}
	return n, true
}

// MaxCost returns the largest cost a request header may set for the rule: max_cost,
// or the package's MaxCost when the rule has no cost_header. The filter uses it to
// bound a response cost too.
func (r *CompiledRule) MaxCost() uint64 {
	if r.costHeader == "" {
		return MaxCost
	}
	return r.maxCost
}

// ParseCost parses a cost header value: ASCII digits only (no sign, no spaces), at
// most MaxCost; anything else, larger values included, is malformed (false). It
// does not allocate.
func ParseCost(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 20 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > MaxCost {
			return 0, false
		}
	}
	return n, true
}
