package rules

import "github.com/sluice-proxy/sluice/shared/strictjson"

// EncodePolicy returns p as canonical JSON: compact, members in the order of the
// struct fields ("policy", "version", "identity", "exempt", "response_headers",
// "rules"), zero values
// and empty lists omitted except "policy", "version" and "rules", strings and
// durations in the canonical forms of package strictjson. Equal policies encode to
// identical bytes, and for a valid p, ParsePolicy(EncodePolicy(p)) equals p. It does
// not validate p.
func EncodePolicy(p *Policy) []byte {
	w := strictjson.NewWriter(make([]byte, 0, 256+256*len(p.Rules)))
	w.BeginObject()
	w.AppendKey("policy")
	w.AppendString(p.Name)
	w.AppendKey("version")
	w.AppendUint(p.Version)
	if p.Identity != (Identity{}) {
		w.AppendKey("identity")
		w.BeginObject()
		optString(w, "user_header", p.Identity.UserHeader)
		optString(w, "tenant_header", p.Identity.TenantHeader)
		w.EndObject()
	}
	writeExempt(w, &p.Exempt)
	if rh := p.ResponseHeaders; rh != nil {
		w.AppendKey("response_headers")
		w.BeginObject()
		w.AppendKey("set")
		w.AppendString(rh.Set)
		if rh.OnAllow {
			w.AppendKey("on_allow")
			w.AppendBool(true)
		}
		w.EndObject()
	}
	w.AppendKey("rules")
	w.BeginArray()
	for i := range p.Rules {
		writeRule(w, &p.Rules[i])
	}
	w.EndArray()
	w.EndObject()
	return w.Bytes()
}

// EncodeRule returns r as canonical JSON, members in the order of the struct fields
// ("id", "description", "descriptor", "match", "key", "algorithm", "limit", "window", "burst",
// "slots", "align", "timezone", "lease", "cost", "cost_header", "max_cost",
// "response_cost_header", "shadow", "status", "exempt", "scope", "on_quota_failure",
// "local_share"), zero values and empty lists
// omitted except "id", "algorithm" and "limit". It is the form a rule takes inside
// EncodePolicy, and what the rule fingerprint hashes. It does not validate r.
func EncodeRule(r *Rule) []byte {
	w := strictjson.NewWriter(make([]byte, 0, 256))
	writeRule(w, r)
	return w.Bytes()
}

func writeRule(w *strictjson.Writer, r *Rule) {
	w.BeginObject()
	w.AppendKey("id")
	w.AppendString(r.ID)
	optString(w, "description", r.Description)
	writeDescriptor(w, r.Descriptor)
	if !r.Match.isZero() {
		w.AppendKey("match")
		w.BeginObject()
		optString(w, "path_prefix", r.Match.PathPrefix)
		optString(w, "path", r.Match.Path)
		optList(w, "methods", r.Match.Methods)
		if len(r.Match.Headers) > 0 {
			w.AppendKey("headers")
			w.BeginArray()
			for _, h := range r.Match.Headers {
				w.BeginObject()
				w.AppendKey("name")
				w.AppendString(h.Name)
				optString(w, "exact", h.Exact)
				optString(w, "prefix", h.Prefix)
				optTrue(w, "present", h.Present)
				optTrue(w, "absent", h.Absent)
				w.EndObject()
			}
			w.EndArray()
		}
		w.EndObject()
	}
	optList(w, "key", r.Key)
	w.AppendKey("algorithm")
	w.AppendString(r.Algorithm)
	w.AppendKey("limit")
	w.AppendUint(r.Limit)
	if r.Window != 0 {
		w.AppendKey("window")
		w.AppendDuration(r.Window)
	}
	optUint(w, "burst", r.Burst)
	optUint(w, "slots", uint64(r.Slots))
	optString(w, "align", r.Align)
	optString(w, "timezone", r.Timezone)
	if r.Lease != 0 {
		w.AppendKey("lease")
		w.AppendDuration(r.Lease)
	}
	optUint(w, "cost", r.Cost)
	optString(w, "cost_header", r.CostHeader)
	optUint(w, "max_cost", r.MaxCost)
	optString(w, "response_cost_header", r.ResponseCostHeader)
	optTrue(w, "shadow", r.Shadow)
	if r.Status != 0 {
		w.AppendKey("status")
		w.AppendInt(int64(r.Status))
	}
	writeExempt(w, &r.Exempt)
	optString(w, "scope", r.Scope)
	optString(w, "on_quota_failure", r.OnQuotaFailure)
	if r.LocalSharePermille != 0 {
		w.AppendKey("local_share")
		w.AppendRaw(formatPermille(r.LocalSharePermille))
	}
	w.EndObject()
}

func (m *Match) isZero() bool {
	return m.PathPrefix == "" && m.Path == "" && len(m.Methods) == 0 && len(m.Headers) == 0
}

func writeExempt(w *strictjson.Writer, e *Exempt) {
	if len(e.CIDRs) == 0 && len(e.Users) == 0 && len(e.Tenants) == 0 {
		return
	}
	w.AppendKey("exempt")
	w.BeginObject()
	optList(w, "cidrs", e.CIDRs)
	optList(w, "users", e.Users)
	optList(w, "tenants", e.Tenants)
	w.EndObject()
}

func optString(w *strictjson.Writer, key, v string) {
	if v != "" {
		w.AppendKey(key)
		w.AppendString(v)
	}
}

func optUint(w *strictjson.Writer, key string, v uint64) {
	if v != 0 {
		w.AppendKey(key)
		w.AppendUint(v)
	}
}

func optTrue(w *strictjson.Writer, key string, v bool) {
	if v {
		w.AppendKey(key)
		w.AppendBool(true)
	}
}

func optList(w *strictjson.Writer, key string, list []string) {
	if len(list) == 0 {
		return
	}
	w.AppendKey(key)
	w.BeginArray()
	for _, s := range list {
		w.AppendString(s)
	}
	w.EndArray()
}
