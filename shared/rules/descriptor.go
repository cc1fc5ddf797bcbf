package rules

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// Bounds on descriptors.
const (
	// MaxDescriptorEntries is the most entries a rule's descriptor may have.
	MaxDescriptorEntries = 8
	// MaxDescriptorBytes is the longest domain, entry key or entry value, in bytes.
	MaxDescriptorBytes = 256
)

// Descriptor makes a rule a rate limit service rule: it applies to the
// descriptors Envoy's ratelimit filter (envoy.filters.http.ratelimit) sends to the
// control plane's RateLimitService (envoy.service.ratelimit.v3, ShouldRateLimit),
// and to nothing else: the Wasm filter and the rate_limit_quota service never
// apply a rule that has one. A request descriptor matches when its domain is
// Domain and it has exactly len(Entries) entries, the i-th with the i-th entry's
// key and a value it accepts: the path of one node from the top of an
// envoyproxy/ratelimit configuration tree (src/config/config_impl.go, GetLimit).
//
// The rule's counter is keyed by the values of the entries that do not name an
// exact value, in order, each under the tag "d.<key>" (so a rule with only exact
// values has one global counter, and "key" is not allowed with a descriptor);
// as envoyproxy/ratelimit, where the cache key holds every entry's value.
//
// With HTTP the rule applies to HTTP requests too, as a rule without a
// descriptor does (its match and key, in the Wasm filter and the rate limit
// quota service), and descriptors spend the same fleet keys: each entry without
// an exact value names, in KeyPart, the element of the rule's key its value
// fills, so that a descriptor and a request of the same user, say, count on one
// counter.
type Descriptor struct {
	// Domain ["domain"] is the rate limit domain (the ratelimit filter's "domain"),
	// 1 to MaxDescriptorBytes bytes of UTF-8. Required.
	Domain string
	// Entries ["entries"], 1 to MaxDescriptorEntries, are matched in order.
	Entries []DescriptorEntry
	// HTTP ["http"]: the rule also applies to HTTP requests, on the same fleet
	// keys (see above). Default false: descriptors only.
	HTTP bool
	// Unlimited ["unlimited"]: a descriptor the rule names is never limited nor
	// counted, and is answered OK (envoyproxy/ratelimit's unlimited: a more
	// specific node that exempts what a less specific one limits). The rule then
	// has no algorithm, limit or other limit parameter, no shadow, status or
	// scope, and no HTTP.
	Unlimited bool
	// NoLimit ["no_limit"]: a descriptor the rule names has no limit: it is
	// answered OK with neither a current limit nor a remaining count, and not
	// counted, so that a less specific rule does not limit it
	// (envoyproxy/ratelimit's descriptor without a rate_limit, which its
	// README calls whitelisting a value). As with Unlimited the rule has only
	// id, description and descriptor; not both.
	NoLimit bool
	// QuotaMode ["quota_mode"]: a descriptor over the limit is answered OK,
	// with the limit and nothing remaining but no reset, instead of
	// OVER_LIMIT (envoyproxy/ratelimit's quota_mode: the caller reads the
	// status and decides). Unlike Shadow the answer says so. Not with HTTP.
	QuotaMode bool
	// Name ["name"] is the name the rule's limit carries in answers
	// (current_limit.name; envoyproxy/ratelimit's rate_limit name, which Envoy
	// adds to the X-RateLimit-Limit header's quota policy). At most
	// MaxDescriptorBytes bytes of UTF-8; empty, the limit has no name.
	Name string
	// Replaces ["replaces"] are ids of descriptor rules of the same policy that
	// this rule replaces: in a call where a descriptor matches this rule, the
	// descriptors matching them are answered OK without a limit and not counted
	// (envoyproxy/ratelimit's replaces, which names rate limits by name). At most
	// MaxReplaces; not this rule itself.
	Replaces []string
}

// MaxReplaces bounds Descriptor.Replaces.
const MaxReplaces = 16

// DescriptorEntry is one (key, value) of a Descriptor.
type DescriptorEntry struct {
	// Key ["key"] is the entry's key, e.g. "generic_key", "remote_address" or a
	// request_headers action's descriptor_key, 1 to MaxDescriptorBytes bytes of
	// UTF-8. Required.
	Key string
	// Value ["value"] is what the entry's value must be: absent, any value (each
	// value its own counter); a value ending in '*', any value with the prefix
	// before it (each value its own counter unless Shared, as
	// envoyproxy/ratelimit's trailing wildcard); otherwise exactly this value,
	// a '*' before the end included (as there: only a last '*' is a
	// wildcard). At most MaxDescriptorBytes bytes of UTF-8.
	Value string
	// Shared ["shared"], only with a value ending in '*': every value the
	// wildcard accepts counts on one counter (envoyproxy/ratelimit's
	// share_threshold), instead of one counter per value.
	Shared bool
	// KeyPart ["key_part"], only with Descriptor.HTTP and required there for an
	// entry without an exact value, is the element of the rule's "key" whose
	// value the entry's value is: "user", "tenant", "client_ip", "method",
	// "path" or "header:<name>" (one alternative). Every element of the key but
	// "route" is filled by exactly one entry.
	KeyPart string
}

// Passes reports whether the rule's descriptors are answered without a limit
// (Unlimited or NoLimit): the rule has no limit parameters.
func (ds *Descriptor) Passes() bool { return ds.Unlimited || ds.NoLimit }

// AlwaysOver reports whether the rule may have a limit of 0, every descriptor
// over it (envoyproxy/ratelimit's requests_per_unit: 0): a fixed_window
// descriptor rule without HTTP.
func (r *Rule) AlwaysOver() bool {
	return r.Descriptor != nil && !r.Descriptor.HTTP && !r.Descriptor.Passes() && r.Algorithm == "fixed_window"
}

// Exact reports whether the entry names one exact value (the value is then not
// part of the counter key).
func (e *DescriptorEntry) Exact() bool { return e.Value != "" && !strings.HasSuffix(e.Value, "*") }

// Accepts reports whether a request entry's value v is one the entry accepts.
// A descriptor value may be empty in Envoy; the empty value is accepted only by
// an entry without a value.
func (e *DescriptorEntry) Accepts(v string) bool {
	switch {
	case e.Value == "":
		return true
	case strings.HasSuffix(e.Value, "*"):
		return strings.HasPrefix(v, e.Value[:len(e.Value)-1])
	}
	return v == e.Value
}

// Specificity ranks how an entry matches a value, for choosing among rules that
// match one request descriptor: 2 an exact value, 1 a wildcard prefix, 0 any value
// (envoyproxy/ratelimit tries key_value, then wildcards, then the key alone, at
// each level of its tree).
func (e *DescriptorEntry) Specificity() int {
	switch {
	case e.Value == "":
		return 0
	case strings.HasSuffix(e.Value, "*"):
		return 1
	}
	return 2
}

func decodeDescriptor(d *strictjson.Decoder, r *Rule) error {
	if d.Null() {
		return nil
	}
	ds := new(Descriptor)
	r.Descriptor = ds
	return d.Object(func(key string) error {
		switch key {
		case "domain":
			ds.Domain = str(d)
		case "http":
			ds.HTTP, _ = boolean(d)
		case "unlimited":
			ds.Unlimited, _ = boolean(d)
		case "no_limit":
			ds.NoLimit, _ = boolean(d)
		case "quota_mode":
			ds.QuotaMode, _ = boolean(d)
		case "name":
			ds.Name = str(d)
		case "replaces":
			ds.Replaces = strList(d)
		case "entries":
			if d.Null() {
				return nil
			}
			return d.Array(func(int) error {
				ds.Entries = append(ds.Entries, DescriptorEntry{})
				e := &ds.Entries[len(ds.Entries)-1]
				return d.Object(func(key string) error {
					switch key {
					case "key":
						e.Key = str(d)
					case "value":
						e.Value = str(d)
						if e.Value == "" {
							d.Fail("must not be empty (omit it to accept any value)")
						}
					case "key_part":
						e.KeyPart = str(d)
					case "shared":
						e.Shared, _ = boolean(d)
					}
					return nil
				})
			})
		}
		return nil
	})
}

func writeDescriptor(w *strictjson.Writer, ds *Descriptor) {
	if ds == nil {
		return
	}
	w.AppendKey("descriptor")
	w.BeginObject()
	w.AppendKey("domain")
	w.AppendString(ds.Domain)
	w.AppendKey("entries")
	w.BeginArray()
	for _, e := range ds.Entries {
		w.BeginObject()
		w.AppendKey("key")
		w.AppendString(e.Key)
		optString(w, "value", e.Value)
		optString(w, "key_part", e.KeyPart)
		optTrue(w, "shared", e.Shared)
		w.EndObject()
	}
	w.EndArray()
	optTrue(w, "http", ds.HTTP)
	optTrue(w, "unlimited", ds.Unlimited)
	optTrue(w, "no_limit", ds.NoLimit)
	optTrue(w, "quota_mode", ds.QuotaMode)
	optString(w, "name", ds.Name)
	optList(w, "replaces", ds.Replaces)
	w.EndObject()
}

// descriptor validates a rule's descriptor and what it excludes: the HTTP-only
// fields (match, key, cost headers, exempt), which no descriptor carries.
func (v *validator) descriptor(r *Rule, field string) {
	f := func(name string) string { return join(field, name) }
	ds := r.Descriptor
	df := f("descriptor")
	if msg := descriptorText(ds.Domain); msg != "" {
		v.add(join(df, "domain"), msg)
	}
	switch n := len(ds.Entries); {
	case n == 0:
		v.add(join(df, "entries"), "required: at least one entry")
	case n > MaxDescriptorEntries:
		v.add(join(df, "entries"), "at most "+strconv.Itoa(MaxDescriptorEntries)+" entries, got "+strconv.Itoa(n))
	}
	for i := range ds.Entries {
		e := &ds.Entries[i]
		ef := elemPath(join(df, "entries"), i)
		if msg := descriptorText(e.Key); msg != "" {
			v.add(join(ef, "key"), msg)
		}
		if e.Value != "" {
			if len(e.Value) > MaxDescriptorBytes || !utf8.ValidString(e.Value) {
				v.add(join(ef, "value"), "must be at most "+strconv.Itoa(MaxDescriptorBytes)+" bytes of UTF-8")
			}
		}
		if e.Shared && !strings.HasSuffix(e.Value, "*") {
			v.add(join(ef, "shared"), "only with a value ending in '*' (a wildcard whose values share one counter)")
		}
	}
	if ds.HTTP {
		v.boundKey(r, field)
	} else {
		if !r.Match.isZero() {
			v.add(f("match"), `not with descriptor unless "http": true (a descriptor rule applies to rate limit service descriptors only)`)
		}
		if len(r.Key) > 0 {
			v.add(f("key"), `not with descriptor unless "http": true (its counter is keyed by the values of its entries without an exact value)`)
		}
		for i := range ds.Entries {
			if ds.Entries[i].KeyPart != "" {
				v.add(join(elemPath(join(df, "entries"), i), "key_part"), `only with "http": true`)
			}
		}
	}
	if r.CostHeader != "" {
		v.add(f("cost_header"), "not with descriptor (a descriptor's hits_addend is its cost)")
	}
	if r.ResponseCostHeader != "" {
		v.add(f("response_cost_header"), "not with descriptor")
	}
	if len(r.Exempt.CIDRs)+len(r.Exempt.Users)+len(r.Exempt.Tenants) > 0 {
		v.add(f("exempt"), "not with descriptor")
	}
	if len(ds.Name) > MaxDescriptorBytes || !utf8.ValidString(ds.Name) {
		v.add(join(df, "name"), "must be at most "+strconv.Itoa(MaxDescriptorBytes)+" bytes of UTF-8")
	}
	if len(ds.Replaces) > MaxReplaces {
		v.add(join(df, "replaces"), "at most "+strconv.Itoa(MaxReplaces)+" rule ids")
	}
	for i, id := range ds.Replaces {
		if id == r.ID {
			v.add(elemPath(join(df, "replaces"), i), "a rule does not replace itself")
		}
	}
	if ds.QuotaMode && (ds.HTTP || ds.Passes()) {
		v.add(join(df, "quota_mode"), "only on a limited descriptor rule without http")
	}
	if ds.Unlimited && ds.NoLimit {
		v.add(join(df, "no_limit"), "not with unlimited (one or the other)")
	}
	if ds.Passes() {
		if r.Algorithm != "" || r.Limit != 0 || r.Window != 0 || r.Burst != 0 || r.Slots != 0 || r.Align != "" ||
			r.Timezone != "" || r.Lease != 0 || r.Cost != 0 || r.MaxCost != 0 || r.Shadow || r.Status != 0 ||
			r.Scope != "" || r.OnQuotaFailure != "" || r.LocalSharePermille != 0 {
			v.add(field, "an unlimited or no_limit descriptor rule has only id, description and descriptor (no algorithm, limit parameters, shadow, status or scope)")
		}
		if ds.HTTP {
			v.add(join(df, "http"), "not with unlimited or no_limit (an HTTP request no rule limits needs no rule)")
		}
	} else if !r.IsFleet() {
		v.add(f("scope"), `must be "fleet" with descriptor (the control plane decides descriptors from the fleet budget for every Envoy and replica)`)
	}
}

// Request returns what a request descriptor's entries (in order, Name the key;
// a descriptor ds matched) say to a rule with descriptor ds, for its counter key
// (Compiled.AppendKey): with HTTP, each entry's value set where its KeyPart reads
// (the user, tenant, client IP, method, path or a header); without, the entries
// as Request.Descriptor. ok is false when a client_ip value is no IP address.
func (ds *Descriptor) Request(entries []Header) (req Request, ok bool) {
	if !ds.HTTP {
		return Request{Descriptor: entries}, true
	}
	for i := range ds.Entries {
		part := ds.Entries[i].KeyPart
		if part == "" || i >= len(entries) {
			continue
		}
		if _, valid := req.SetPart(part, entries[i].Value); !valid {
			return req, false
		}
	}
	return req, true
}

// Path is a string naming ds's domain and entries, the same for two
// descriptors exactly when the RateLimitService would take them for one
// (the same domain, keys and values, in order). Its form is not part of any
// API.
func (ds *Descriptor) Path() string { return descriptorPath(ds) }

// descriptorPath is a string naming ds's domain and entries, distinct for
// distinct ones (lengths before texts).
func descriptorPath(ds *Descriptor) string {
	b := strconv.AppendInt(nil, int64(len(ds.Domain)), 10)
	b = append(b, ':')
	b = append(b, ds.Domain...)
	for _, e := range ds.Entries {
		b = strconv.AppendInt(b, int64(len(e.Key)), 10)
		b = append(b, ':')
		b = append(b, e.Key...)
		b = strconv.AppendInt(b, int64(len(e.Value)), 10)
		b = append(b, ':')
		b = append(b, e.Value...)
	}
	return string(b)
}

// boundKey checks an HTTP descriptor rule's binding of its entries to its key:
// every entry without an exact value fills one key element, every element but
// route is filled once.
func (v *validator) boundKey(r *Rule, field string) {
	df := join(field, "descriptor")
	filled := make([]bool, len(r.Key))
	for i := range r.Descriptor.Entries {
		e := &r.Descriptor.Entries[i]
		ef := join(elemPath(join(df, "entries"), i), "key_part")
		switch {
		case e.Exact() && e.KeyPart != "":
			v.add(ef, "not with an exact value (the value is not part of the counter)")
			continue
		case e.Exact():
			continue
		case e.KeyPart == "":
			v.add(ef, `required with "http": true for an entry without an exact value: the element of the rule's key it fills`)
			continue
		}
		j := -1
		for k, part := range r.Key {
			if part == e.KeyPart {
				j = k
			}
		}
		alt, ok := parseKeyAlt(e.KeyPart)
		switch {
		case j < 0:
			v.add(ef, "must be an element of the rule's key, got "+quoteClipped(e.KeyPart))
		case !ok || alt.kind == partRoute:
			v.add(ef, "must be one of user, tenant, client_ip, method, path, header:<name> (one alternative), got "+quoteClipped(e.KeyPart))
		case filled[j]:
			v.add(ef, "fills "+quoteClipped(e.KeyPart)+" a second time")
		default:
			filled[j] = true
		}
	}
	for k, part := range r.Key {
		if !filled[k] && part != "route" {
			v.add(elemPath(join(field, "key"), k), "no descriptor entry fills it (key_part)")
		}
	}
}

func descriptorText(s string) string {
	switch {
	case s == "":
		return "required"
	case len(s) > MaxDescriptorBytes || !utf8.ValidString(s):
		return "must be at most " + strconv.Itoa(MaxDescriptorBytes) + " bytes of UTF-8"
	}
	return ""
}
