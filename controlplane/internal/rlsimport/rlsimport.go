// Package rlsimport turns envoyproxy/ratelimit configuration files into a sluice
// policy of descriptor rules (rules.Descriptor), so a team moving from
// envoyproxy/ratelimit to sluice's RateLimitService keeps its files' meaning.
// What it reads is envoyproxy/ratelimit's file format (its README,
// "Configuration"; src/config/config_impl.go, loadConfig and loadDescriptors):
//
//	domain: mongo_cps
//	descriptors:
//	  - key: database
//	    value: users
//	    rate_limit:
//	      unit: second
//	      requests_per_unit: 500
//	    descriptors: [...]
//
// Each descriptor with a rate_limit becomes one fixed_window rule of scope
// fleet whose descriptor is the path from the domain to it; its window is the
// unit (second, minute, hour, day, week; a month is 30 days and a year 365, as
// there), its limit requests_per_unit (0, or none: every descriptor over it);
// an unlimited one a rule of an unlimited descriptor; a descriptor with neither
// a rate_limit nor descriptors below it (a value exempted from its key's limit)
// a no_limit rule; replaces names the replaced rules by id; the rate limit's
// name is the rule's descriptor name; share_threshold marks the wildcard entry
// shared; quota_mode the descriptor's quota mode. Two files of one domain are
// refused unless merging is asked for, and a descriptor's key and value twice
// at one level always, as there. What sluice cannot express is refused with
// the file, line and field.
package rlsimport

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	yamlparser "github.com/goccy/go-yaml/parser"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// File is one configuration file: its name (for messages) and contents.
type File struct {
	Name string
	Data []byte
}

// Result is an import: the policy, and notes on what was accepted without an
// equivalent (metrics-only fields), one line each.
type Result struct {
	Policy *rules.Policy
	Notes  []string
}

// Units are the rate_limit units envoyproxy/ratelimit accepts (the enum of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit, case-insensitive)
// and their length (src/utils/utilities.go, UnitToDivider).
var Units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// Options change what Import accepts.
type Options struct {
	// MergeDomains lets several files name one domain, their descriptors
	// merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain
	// in a second file is refused, as there.
	MergeDomains bool
}

// Import reads files into a policy named policy; the rules are in file order.
// The error lists every problem found, each "file:line: field: message".
func Import(policy string, files []File, o Options) (*Result, error) {
	im := &importer{res: &Result{Policy: &rules.Policy{Name: policy}}, ids: map[string]bool{}, paths: map[string]string{},
		names: map[[2]string]string{}, domains: map[string]string{}, o: o}
	for _, f := range files {
		im.file(f)
	}
	for _, pr := range im.pending {
		ds := im.res.Policy.Rules[pr.rule].Descriptor
		for _, n := range pr.names {
			id, ok := im.names[[2]string{pr.domain, n}]
			if !ok {
				im.errs = append(im.errs, pr.where+": replaces: no rate_limit of domain "+strconv.Quote(pr.domain)+" is named "+strconv.Quote(n))
				continue
			}
			ds.Replaces = append(ds.Replaces, id)
		}
	}
	if len(im.errs) > 0 {
		return nil, errors.New(strings.Join(im.errs, "\n"))
	}
	if err := im.res.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("the imported policy does not validate: %w", err)
	}
	return im.res, nil
}

type importer struct {
	o   Options
	res *Result
	// domains maps each domain read to the file that named it first.
	domains map[string]string
	errs    []string
	ids     map[string]bool
	paths   map[string]string // descriptor path → where it was first defined
	name    string            // the current file
	// names maps a rate limit's (domain, name) to its rule's id; pending are
	// the replaces to resolve once every file is read.
	names   map[[2]string]string
	pending []pendingReplace
}

// pendingReplace is a rate limit's replaces, by name, to map to rule ids.
type pendingReplace struct {
	rule   int // index in the policy's rules
	domain string
	names  []string
	where  string // file:line of the replaces
}

// goccyPos is the position goccy/go-yaml's parser puts first in its errors.
var goccyPos = regexp.MustCompile(`^\[(\d+):(\d+)\] (.*)`)

// syntaxError is ":line: not YAML: message" for a file that yaml.v3 could not
// decode (err). yaml.v3 names the line a block began on, not the one at fault
// ("line 2: did not find expected key" for a bad indent on line 6), so the
// file is parsed again with github.com/goccy/go-yaml, whose parser names the
// line and column of the token at fault; when it finds no error, err's own
// message is kept.
func syntaxError(data []byte, err error) string {
	if _, perr := yamlparser.ParseBytes(data, 0); perr != nil {
		first, _, _ := strings.Cut(perr.Error(), "\n")
		if m := goccyPos.FindStringSubmatch(first); m != nil {
			return ":" + m[1] + ": not YAML: " + m[3] + " (column " + m[2] + ")"
		}
	}
	return ": not YAML: " + err.Error()
}

func (im *importer) fail(n *yaml.Node, field, msg string) {
	line := 0
	if n != nil {
		line = n.Line
	}
	im.errs = append(im.errs, im.name+":"+strconv.Itoa(line)+": "+field+": "+msg)
}

func (im *importer) file(f File) {
	im.name = f.Name
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		im.errs = append(im.errs, f.Name+syntaxError(f.Data, err))
		return
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		im.fail(&doc, "(top)", "want a mapping with domain and descriptors")
		return
	}
	var domain string
	var descs *yaml.Node
	im.each(doc.Content[0], "", func(k string, v *yaml.Node) {
		switch k {
		case "domain":
			domain = im.str(v, "domain")
		case "descriptors":
			descs = v
		default:
			im.unknown(v, k)
		}
	})
	if domain == "" {
		im.fail(doc.Content[0], "domain", "required (envoyproxy/ratelimit: config file cannot have empty domain)")
		return
	}
	if first, dup := im.domains[domain]; dup && !im.o.MergeDomains {
		im.fail(doc.Content[0], "domain", "domain "+strconv.Quote(domain)+" is also in "+first+
			" (envoyproxy/ratelimit: duplicate domain); merge them with --merge-domains (its MERGE_DOMAIN_CONFIG)")
		return
	} else if !dup {
		im.domains[domain] = f.Name
	}
	if descs != nil {
		im.descriptors(descs, "descriptors", domain, nil)
	}
}

// descriptors reads a list of descriptors under path (the entries above them).
func (im *importer) descriptors(list *yaml.Node, field, domain string, path []rules.DescriptorEntry) {
	if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return // "descriptors:" with nothing: none, as there
	}
	if list.Kind != yaml.SequenceNode {
		im.fail(list, field, "want a list of descriptors")
		return
	}
	for i, n := range list.Content {
		im.descriptor(n, field+"["+strconv.Itoa(i)+"]", domain, path)
	}
}

func (im *importer) descriptor(n *yaml.Node, field, domain string, path []rules.DescriptorEntry) {
	if n.Kind != yaml.MappingNode {
		im.fail(n, field, "want a mapping (key, value, rate_limit, descriptors)")
		return
	}
	var e rules.DescriptorEntry
	var rl, children, shareNode *yaml.Node
	shadow, quotaMode := false, false
	im.each(n, field, func(k string, v *yaml.Node) {
		f := field + "." + k
		switch k {
		case "key":
			e.Key = im.str(v, f)
		case "value":
			e.Value = im.str(v, f)
		case "rate_limit":
			rl = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow = im.boolean(v, f)
		case "detailed_metric", "value_to_metric":
			im.boolean(v, f)
			im.res.Notes = append(im.res.Notes, im.name+":"+strconv.Itoa(v.Line)+": "+f+": metrics naming only; sluice's metrics are per rule")
		case "quota_mode":
			quotaMode = im.boolean(v, f)
		case "share_threshold":
			e.Shared, shareNode = im.boolean(v, f), v
		default:
			im.unknown(v, field+"."+k)
		}
	})
	if e.Key == "" {
		im.fail(n, field+".key", "required (envoyproxy/ratelimit: descriptor has empty key)")
		return
	}
	if e.Shared && !strings.HasSuffix(e.Value, "*") {
		im.fail(shareNode, field+".share_threshold", "only with a value ending in '*' (envoyproxy/ratelimit refuses it too)")
		return
	}
	here := append(append([]rules.DescriptorEntry(nil), path...), e)
	key := domain + "\x00" + pathText(here)
	if where, dup := im.paths[key]; dup {
		im.fail(n, field, "the key and value "+strconv.Quote(pathText(here))+" again at this level (also "+where+
			"; envoyproxy/ratelimit: duplicate descriptor composite key)")
		return
	}
	im.paths[key] = im.name + ":" + strconv.Itoa(n.Line)
	if len(here) > rules.MaxDescriptorEntries {
		im.fail(n, field, "nested deeper than the "+strconv.Itoa(rules.MaxDescriptorEntries)+" entries a sluice descriptor may have")
		return
	}
	switch {
	case rl != nil:
		im.rule(rl, field+".rate_limit", domain, here, shadow, quotaMode)
	case children == nil || len(children.Content) == 0:
		// No limit and nothing below: the value is exempt from a less
		// specific descriptor's limit.
		ds := &rules.Descriptor{Domain: domain, Entries: here, NoLimit: true}
		im.res.Policy.Rules = append(im.res.Policy.Rules, rules.Rule{ID: im.id("", domain, here), Descriptor: ds,
			Description: "envoyproxy/ratelimit descriptor without rate_limit"})
	}
	if rl == nil && (shadow || quotaMode) {
		im.res.Notes = append(im.res.Notes, im.name+":"+strconv.Itoa(n.Line)+": "+field+": shadow_mode or quota_mode without a rate_limit here; ignored")
	}
	if children != nil {
		im.descriptors(children, field+".descriptors", domain, here)
	}
}

func (im *importer) rule(n *yaml.Node, field, domain string, path []rules.DescriptorEntry, shadow, quotaMode bool) {
	if n.Kind != yaml.MappingNode {
		im.fail(n, field, "want a mapping (unit, requests_per_unit)")
		return
	}
	var unit, name string
	var rpu uint64
	var replacesNode *yaml.Node
	var replaces []string
	unlimited := false
	im.each(n, field, func(k string, v *yaml.Node) {
		f := field + "." + k
		switch k {
		case "unit":
			unit = strings.ToLower(im.str(v, f))
		case "requests_per_unit":
			// Absent or 0: every descriptor is over the limit, as there.
			u, err := strconv.ParseUint(v.Value, 10, 32)
			if v.Kind != yaml.ScalarNode || err != nil {
				im.fail(v, f, "want a whole number of requests, 0 to 4294967295")
			}
			rpu = u
		case "unlimited":
			unlimited = im.boolean(v, f)
		case "name":
			name = im.str(v, f)
		case "replaces":
			replacesNode = v
			replaces = im.replaces(v, f)
		default:
			im.unknown(v, f)
		}
	})
	if name != "" && slices.Contains(replaces, name) {
		im.fail(replacesNode, field+".replaces", "replaces should not contain the name of the same descriptor")
	}
	window, ok := Units[unit]
	switch {
	case unlimited && unit != "":
		im.fail(n, field+".unit", "should not be given with unlimited (envoyproxy/ratelimit refuses it too)")
		return
	case unlimited:
		if shadow || quotaMode {
			im.res.Notes = append(im.res.Notes, im.name+":"+strconv.Itoa(n.Line)+": "+field+": shadow_mode or quota_mode on an unlimited descriptor; ignored")
		}
	case !ok:
		im.fail(n, field+".unit", "want one of second, minute, hour, day, week, month, year, got "+strconv.Quote(unit)+
			" (envoyproxy/ratelimit: invalid rate limit unit)")
		return
	}
	ds := &rules.Descriptor{Domain: domain, Entries: path, Unlimited: unlimited, Name: name}
	r := rules.Rule{ID: im.id(name, domain, path), Descriptor: ds}
	if !unlimited {
		r.Algorithm, r.Limit, r.Window, r.Scope, r.Shadow = "fixed_window", rpu, window, rules.ScopeFleet, shadow
		ds.QuotaMode = quotaMode
	}
	if name != "" {
		r.Description = "envoyproxy/ratelimit rate_limit " + strconv.Quote(name)
		if prev, dup := im.names[[2]string{domain, name}]; dup {
			im.fail(n, field+".name", "the name of another rate_limit of this domain too (rule "+prev+"): replaces could not tell them apart")
		}
		im.names[[2]string{domain, name}] = r.ID
	}
	if len(replaces) > 0 {
		im.pending = append(im.pending, pendingReplace{rule: len(im.res.Policy.Rules), domain: domain, names: replaces,
			where: im.name + ":" + strconv.Itoa(replacesNode.Line)})
	}
	im.res.Policy.Rules = append(im.res.Policy.Rules, r)
}

// replaces reads a rate_limit's replaces (a list of {name: …}).
func (im *importer) replaces(v *yaml.Node, f string) (names []string) {
	if v.Kind != yaml.SequenceNode {
		im.fail(v, f, "want a list of {name: …}")
		return nil
	}
	for i, r := range v.Content {
		rf := f + "[" + strconv.Itoa(i) + "]"
		if r.Kind != yaml.MappingNode {
			im.fail(r, rf, "want {name: …}")
			continue
		}
		im.each(r, rf, func(k string, rv *yaml.Node) {
			if k != "name" {
				im.unknown(rv, rf+"."+k)
				return
			}
			n := im.str(rv, rf+".name")
			if n == "" {
				im.fail(rv, rf+".name", "must not be empty (envoyproxy/ratelimit: should not have an empty replaces entry)")
				return
			}
			names = append(names, n)
		})
	}
	return names
}

// id makes a rule id from a rate limit's name or its descriptor's path:
// lower case, other characters '-', unique in the policy (a hash suffix when it
// is long or taken).
func (im *importer) id(name, domain string, path []rules.DescriptorEntry) string {
	src := name
	if src == "" {
		src = domain + "." + pathText(path)
	}
	b := []byte(strings.ToLower(src))
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (c == '_' || c == '.' || c == '-') && i > 0
		if !ok {
			b[i] = '-'
		}
	}
	id := string(b)
	if !rules.ValidID(id) || im.ids[id] {
		h := fnv.New32a()
		h.Write([]byte(domain + "\x00" + pathText(path)))
		id = strings.TrimRight(id[:min(len(id), rules.MaxIDBytes-9)], "-._") + "-" + fmt.Sprintf("%08x", h.Sum32())
	}
	im.ids[id] = true
	return id
}

// pathText is the path as envoyproxy/ratelimit names it: key or key_value,
// joined by '.'.
func pathText(path []rules.DescriptorEntry) string {
	parts := make([]string, len(path))
	for i, e := range path {
		parts[i] = e.Key
		if e.Value != "" {
			parts[i] += "_" + e.Value
		}
	}
	return strings.Join(parts, ".")
}

// each calls fn for each key of mapping n.
func (im *importer) each(n *yaml.Node, field string, fn func(k string, v *yaml.Node)) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			im.fail(k, field, "a key that is not a string")
			continue
		}
		fn(k.Value, n.Content[i+1])
	}
}

func (im *importer) unknown(v *yaml.Node, field string) {
	im.fail(v, field, "unknown field (envoyproxy/ratelimit refuses it too)")
}

func (im *importer) str(v *yaml.Node, field string) string {
	if v.Kind != yaml.ScalarNode {
		im.fail(v, field, "want a string")
		return ""
	}
	return v.Value
}

func (im *importer) boolean(v *yaml.Node, field string) bool {
	var b bool
	if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
		im.fail(v, field, "want true or false")
	}
	return b
}
