package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// FieldChange is one changed leaf: its path inside the rule or policy, the
// old and new values as compact JSON ("" when absent).
type FieldChange struct {
	// Field is the path, e.g. "limit" or "match.path".
	Field string
	// Old and New are compact JSON, "" when absent.
	Old, New string
}

// RuleChange is what happens to one rule: added, removed or changed.
type RuleChange struct {
	// ID is the rule's id.
	ID string
	// Kind is "added", "removed" or "changed".
	Kind string
	// Fields are the rule's leaves that differ (every leaf for an added or
	// removed rule).
	Fields []FieldChange
}

// PolicyDiff is the rule-level difference between the server's policy and
// a file's.
type PolicyDiff struct {
	// Name is the policy's name; Exists is false when the server has no
	// such policy (everything in the file is new).
	Name   string
	Exists bool
	// Rules are the added, changed and removed rules: the file's order,
	// then the removed ones in the server's order.
	Rules []RuleChange
	// Policy are the changed top-level members other than rules
	// (identity, exempt), as paths such as "identity.user_header".
	Policy []FieldChange
	// OrderOld and OrderNew are the rule ids in the server's and the
	// file's order, set only when the rules both have are in another order
	// (rules are checked in order).
	OrderOld, OrderNew []string
	// OldVersion and OldETag are the server's version and entity tag.
	OldVersion uint64
	OldETag    string
	// RuleCountNew is the number of rules in the file.
	RuleCountNew int
}

// Empty reports whether the file and the server agree.
func (d *PolicyDiff) Empty() bool {
	return d.Exists && len(d.Rules) == 0 && len(d.Policy) == 0 && d.OrderOld == nil
}

// diffPolicies compares two policy documents (JSON objects; old nil when
// the policy does not exist). The "version" member is ignored.
func diffPolicies(name string, old, desired []byte) (*PolicyDiff, error) {
	d := &PolicyDiff{Name: name, Exists: old != nil}
	var o, n map[string]any
	if old != nil {
		if err := json.Unmarshal(old, &o); err != nil {
			return nil, fmt.Errorf("the server's policy %q is not a JSON object: %v", name, err)
		}
		if v, ok := o["version"].(float64); ok {
			d.OldVersion = uint64(v)
		}
	}
	if err := json.Unmarshal(desired, &n); err != nil {
		return nil, err
	}
	oldRules, oldIDs := indexRules(o["rules"])
	newRules, newIDs := indexRules(n["rules"])
	d.RuleCountNew = len(newIDs)
	for _, id := range newIDs {
		or, ok := oldRules[id]
		if !ok {
			d.Rules = append(d.Rules, RuleChange{ID: id, Kind: "added", Fields: diffValues("", nil, newRules[id])})
			continue
		}
		if fc := diffValues("", or, newRules[id]); len(fc) > 0 {
			d.Rules = append(d.Rules, RuleChange{ID: id, Kind: "changed", Fields: fc})
		}
	}
	for _, id := range oldIDs {
		if _, ok := newRules[id]; !ok {
			d.Rules = append(d.Rules, RuleChange{ID: id, Kind: "removed", Fields: diffValues("", oldRules[id], nil)})
		}
	}
	if d.Exists {
		// Same set of rules in another order: rules are checked in order.
		var common []string
		for _, id := range oldIDs {
			if _, ok := newRules[id]; ok {
				common = append(common, id)
			}
		}
		var commonNew []string
		for _, id := range newIDs {
			if _, ok := oldRules[id]; ok {
				commonNew = append(commonNew, id)
			}
		}
		if strings.Join(common, "\x00") != strings.Join(commonNew, "\x00") {
			d.OrderOld, d.OrderNew = oldIDs, newIDs
		}
	}
	for _, m := range []map[string]any{o, n} {
		delete(m, "rules")
		delete(m, "version")
		delete(m, "policy")
	}
	var om any // nil: absent
	if d.Exists {
		om = o
	}
	d.Policy = diffValues("", om, n)
	return d, nil
}

// indexRules maps each rule's id to the rule, and lists the ids in order.
func indexRules(v any) (map[string]any, []string) {
	list, _ := v.([]any)
	m := map[string]any{}
	var ids []string
	for _, r := range list {
		obj, _ := r.(map[string]any)
		id, _ := obj["id"].(string)
		m[id] = r
		ids = append(ids, id)
	}
	return m, ids
}

// diffValues lists the leaves that differ between a and b (either may be
// nil: absent). Objects are compared member by member; arrays and scalars
// as whole values.
func diffValues(prefix string, a, b any) []FieldChange {
	ao, aObj := a.(map[string]any)
	bo, bObj := b.(map[string]any)
	if (aObj || a == nil) && (bObj || b == nil) && (aObj || bObj) {
		keys := map[string]bool{}
		for k := range ao {
			keys[k] = true
		}
		for k := range bo {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		var out []FieldChange
		for _, k := range sorted {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			var av, bv any
			if ao != nil {
				av = ao[k]
			}
			if bo != nil {
				bv = bo[k]
			}
			out = append(out, diffValues(p, av, bv)...)
		}
		return out
	}
	as, bs := compact(a), compact(b)
	if as == bs {
		return nil
	}
	return []FieldChange{{Field: prefix, Old: as, New: bs}}
}

func compact(v any) string {
	if v == nil {
		return ""
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(buf.String(), "\n")
}

// print writes the diff, rule by rule:
//
//	~ rule api-per-user
//	    limit: 5 → 10
//	+ rule new
//	    algorithm: "token_bucket"
//	- rule old
func (d *PolicyDiff) print(w io.Writer) {
	switch {
	case !d.Exists:
		fmt.Fprintf(w, "policy %s: new (not on the server), %d rule(s)\n", d.Name, d.RuleCountNew)
	case d.Empty():
		fmt.Fprintf(w, "policy %s: unchanged (server v%d)\n", d.Name, d.OldVersion)
		return
	default:
		fmt.Fprintf(w, "policy %s: server v%d differs: %s\n", d.Name, d.OldVersion, d.counts())
	}
	d.printChanges(w)
}

// counts is "N rule(s) changed, N added, N removed".
func (d *PolicyDiff) counts() string {
	var added, removed, changed int
	for _, r := range d.Rules {
		switch r.Kind {
		case "added":
			added++
		case "removed":
			removed++
		default:
			changed++
		}
	}
	return fmt.Sprintf("%d rule(s) changed, %d added, %d removed", changed, added, removed)
}

// printChanges writes d's changes, one indented line a field or rule (print's
// body).
func (d *PolicyDiff) printChanges(w io.Writer) {
	for _, fc := range d.Policy {
		printField(w, "  ", fc)
	}
	for _, r := range d.Rules {
		mark := map[string]string{"added": "+", "removed": "-", "changed": "~"}[r.Kind]
		fmt.Fprintf(w, "  %s rule %s\n", mark, r.ID)
		if r.Kind == "removed" {
			continue
		}
		for _, fc := range r.Fields {
			if fc.Field != "id" {
				printField(w, "      ", fc)
			}
		}
	}
	if d.OrderOld != nil {
		fmt.Fprintf(w, "  ~ rule order: %s → %s\n", strings.Join(d.OrderOld, ", "), strings.Join(d.OrderNew, ", "))
	}
}

func printField(w io.Writer, indent string, fc FieldChange) {
	switch {
	case fc.Old == "":
		fmt.Fprintf(w, "%s%s: %s\n", indent, fc.Field, fc.New)
	case fc.New == "":
		fmt.Fprintf(w, "%s%s: %s → (removed)\n", indent, fc.Field, fc.Old)
	default:
		fmt.Fprintf(w, "%s%s: %s → %s\n", indent, fc.Field, fc.Old, fc.New)
	}
}
