package rlsconformance

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// cnode is one descriptor of a configuration file, as far as the calls need
// it: its key and value, its rate limit, its children.
type cnode struct {
	key, value string
	limited    bool // has a rate_limit that is not unlimited
	rpu        uint64
	unit       string // lower case
	children   []*cnode
}

// domainTree is a domain's descriptors, from every file that names it.
type domainTree struct {
	name  string
	nodes []*cnode
}

// readTrees reads the files' domains (files of one domain appended, as a
// merge does).
func readTrees(t *testing.T, files []configFile) []*domainTree {
	t.Helper()
	var out []*domainTree
	for _, f := range files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		var root struct {
			Domain      string
			Descriptors []yamlDesc
		}
		if err := yaml.Unmarshal(b, &root); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		var d *domainTree
		for _, x := range out {
			if x.name == root.Domain {
				d = x
			}
		}
		if d == nil {
			d = &domainTree{name: root.Domain}
			out = append(out, d)
		}
		d.nodes = append(d.nodes, convert(root.Descriptors)...)
	}
	return out
}

type yamlDesc struct {
	Key       string
	Value     string
	RateLimit *struct {
		RequestsPerUnit uint64 `yaml:"requests_per_unit"`
		Unit            string
		Unlimited       bool
	} `yaml:"rate_limit"`
	Descriptors []yamlDesc
}

func convert(ds []yamlDesc) []*cnode {
	var out []*cnode
	for _, d := range ds {
		n := &cnode{key: d.Key, value: d.Value, children: convert(d.Descriptors)}
		if rl := d.RateLimit; rl != nil && !rl.Unlimited {
			n.limited, n.rpu, n.unit = true, rl.RequestsPerUnit, strings.ToLower(rl.Unit)
		}
		out = append(out, n)
	}
	return out
}

// overrideUnits are the units a limit override can name, by the
// configuration's name.
var overrideUnits = map[string]typev3.RateLimitUnit{"minute": typev3.RateLimitUnit_MINUTE, "hour": typev3.RateLimitUnit_HOUR,
	"day": typev3.RateLimitUnit_DAY}

// step is one call of a sequence and what it is for (in messages).
type step struct {
	what string
	req  *rlsv3.RateLimitRequest
	// second: the call's counters have one-second windows (the sequence is
	// kept within one second).
	second bool
}

// entry is a descriptor entry.
type entry struct{ k, v string }

func descriptor(es []entry) *commonrl.RateLimitDescriptor {
	d := &commonrl.RateLimitDescriptor{}
	for _, e := range es {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: e.k, Value: e.v})
	}
	return d
}

func text(es []entry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.k + "=" + e.v
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// values are the request values that exercise a node's value: an exact value
// itself; a trailing wildcard's prefix with two suffixes (two counters); any
// value, two of them; a value with a '*' before its end, the value itself and
// one its '*' would accept as a wildcard.
func values(n *cnode) []string {
	switch {
	case n.value == "":
		return []string{"v1", "v2"}
	case strings.HasSuffix(n.value, "*"):
		p := strings.TrimSuffix(n.value, "*")
		return []string{p + "x1", p + "x2"}
	case strings.Contains(n.value, "*"):
		return []string{n.value, strings.ReplaceAll(n.value, "*", "a")}
	}
	return []string{n.value}
}

// sequences are the calls for one domain: for every descriptor of the tree
// (each of its values), calls of one hit until the limit is passed (a large
// limit: its limit less one in one call, then single hits), a check of 0 hits
// first; the descriptor with one entry more; unknown keys and domains; limit
// overrides; then every limited descriptor in one call.
func sequences(d *domainTree) [][]step {
	var seqs [][]step
	var leaves []*commonrl.RateLimitDescriptor
	// first: every value of the path is its node's first (a check of 0 hits
	// is made only there: a later value of a shared wildcard may find its
	// counter already past the limit, where envoyproxy/ratelimit, counting
	// refused hits too, answers a check OVER_LIMIT and sluice, counting
	// admitted ones, OK with nothing remaining).
	var walk func(path []entry, first bool, nodes []*cnode)
	walk = func(path []entry, first bool, nodes []*cnode) {
		for _, n := range nodes {
			for vi, v := range values(n) {
				first := first && vi == 0
				here := append(append([]entry(nil), path...), entry{n.key, v})
				name := d.name + " " + text(here)
				var seq []step
				mk := func(what string, hits *uint64, reqHits uint32) step {
					desc := descriptor(here)
					if hits != nil {
						desc.HitsAddend = wrapperspb.UInt64(*hits)
					}
					return step{what: name + " " + what, second: n.unit == "second",
						req: &rlsv3.RateLimitRequest{Domain: d.name, Descriptors: []*commonrl.RateLimitDescriptor{desc}, HitsAddend: reqHits}}
				}
				zero := uint64(0)
				if first {
					seq = append(seq, mk("hits_addend 0", &zero, 0))
				}
				switch {
				case !n.limited:
					seq = append(seq, mk("call 1", nil, 0), mk("call 2", nil, 0))
				case n.rpu <= 40:
					for i := uint64(0); i <= n.rpu; i++ {
						seq = append(seq, mk("call "+strconv.FormatUint(i+1, 10), nil, 0))
					}
				default:
					big := n.rpu - 1
					seq = append(seq, mk("hits_addend "+strconv.FormatUint(big, 10), &big, 0), mk("request hits_addend 1", nil, 1),
						mk("then 1", nil, 0))
				}
				seqs = append(seqs, seq)
				if u, ok := overrideUnits[n.unit]; ok && n.limited && first && n.rpu > 5 && (n.value == "" || strings.HasSuffix(n.value, "*")) {
					// A limit override on a descriptor a rule names, in the
					// rule's unit: one counter with the rule's, as the
					// rule's own calls before and after it show.
					ov := append(append([]entry(nil), path...), entry{n.key, strings.TrimSuffix(n.value, "*") + "ov"})
					plain := func(what string) step {
						return step{what: d.name + " " + text(ov) + " " + what, req: &rlsv3.RateLimitRequest{Domain: d.name,
							Descriptors: []*commonrl.RateLimitDescriptor{descriptor(ov)}}}
					}
					seq := []step{plain("before an override"), plain("before an override")}
					for i := range 3 {
						desc := descriptor(ov)
						desc.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: u}
						seq = append(seq, step{what: d.name + " " + text(ov) + " override 5/" + n.unit + " call " + strconv.Itoa(i+1),
							req: &rlsv3.RateLimitRequest{Domain: d.name, Descriptors: []*commonrl.RateLimitDescriptor{desc}}})
					}
					seqs = append(seqs, append(seq, plain("after the override")))
				}
				extra := append(append([]entry(nil), here...), entry{"unconfigured", "x"})
				seqs = append(seqs, []step{{what: d.name + " " + text(extra), req: &rlsv3.RateLimitRequest{Domain: d.name,
					Descriptors: []*commonrl.RateLimitDescriptor{descriptor(extra)}}}})
				if n.limited {
					leaves = append(leaves, descriptor(here))
				}
				walk(here, first, n.children)
			}
		}
	}
	walk(nil, true, d.nodes)
	one := func(what, domain string, es ...entry) []step {
		return []step{{what: what, req: &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonrl.RateLimitDescriptor{descriptor(es)}}}}
	}
	seqs = append(seqs, one("unknown key", d.name, entry{"unconfigured", "x"}),
		one("unknown domain", d.name+"-unknown", entry{"unconfigured", "x"}))
	// Limit overrides: 3 a minute, then 5 a minute on the same entries (one
	// counter: the domain, the entries and the window), and on an unknown
	// domain. The first limit is not passed before the second is used: past
	// it envoyproxy/ratelimit counts the refused hits too (its counter rises
	// past the limit), sluice only what it admits.
	override := func(domain string, rpu uint32, n int) []step {
		var seq []step
		for i := range n {
			desc := descriptor([]entry{{"override", "o1"}})
			desc.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
			seq = append(seq, step{what: domain + " limit override " + strconv.Itoa(int(rpu)) + "/minute call " + strconv.Itoa(i+1),
				req: &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonrl.RateLimitDescriptor{desc}}})
		}
		return seq
	}
	seqs = append(seqs, append(override(d.name, 3, 3), override(d.name, 5, 3)...), override(d.name+"-unknown", 1, 2))
	if len(leaves) > 0 {
		// One sequence, started early in a second: the call holds the
		// per-second limits too, and both calls must meet them in the same
		// window at both services.
		var seq []step
		for i := range 2 {
			seq = append(seq, step{what: d.name + " every limited descriptor, call " + strconv.Itoa(i+1),
				req: &rlsv3.RateLimitRequest{Domain: d.name, Descriptors: leaves}, second: true})
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

// differences compares two answers to one call: the overall code; each
// status's code, current limit (requests per unit, unit, name) and what
// remains; the time until reset within a second. Empty when they agree.
func differences(peer, ours *rlsv3.RateLimitResponse) []string {
	var out []string
	if peer.GetOverallCode() != ours.GetOverallCode() {
		out = append(out, "overall_code "+peer.GetOverallCode().String()+" ≠ "+ours.GetOverallCode().String())
	}
	if len(peer.GetStatuses()) != len(ours.GetStatuses()) {
		return append(out, "statuses "+strconv.Itoa(len(peer.GetStatuses()))+" ≠ "+strconv.Itoa(len(ours.GetStatuses())))
	}
	for i, p := range peer.GetStatuses() {
		o := ours.GetStatuses()[i]
		at := "statuses[" + strconv.Itoa(i) + "]."
		if p.GetCode() != o.GetCode() {
			out = append(out, at+"code "+p.GetCode().String()+" ≠ "+o.GetCode().String())
		}
		pl, ol := p.GetCurrentLimit(), o.GetCurrentLimit()
		switch {
		case (pl == nil) != (ol == nil):
			out = append(out, at+"current_limit "+limitText(pl)+" ≠ "+limitText(ol))
		case pl != nil && (pl.GetRequestsPerUnit() != ol.GetRequestsPerUnit() || pl.GetUnit() != ol.GetUnit() || pl.GetName() != ol.GetName()):
			out = append(out, at+"current_limit "+limitText(pl)+" ≠ "+limitText(ol))
		}
		if p.GetLimitRemaining() != o.GetLimitRemaining() {
			out = append(out, at+"limit_remaining "+strconv.FormatUint(uint64(p.GetLimitRemaining()), 10)+" ≠ "+
				strconv.FormatUint(uint64(o.GetLimitRemaining()), 10))
		}
		pr, or := p.GetDurationUntilReset(), o.GetDurationUntilReset()
		switch {
		case (pr == nil) != (or == nil):
			out = append(out, at+"duration_until_reset "+pr.String()+" ≠ "+or.String())
		case pr != nil:
			if d := pr.AsDuration() - or.AsDuration(); d > time.Second || d < -time.Second {
				out = append(out, at+"duration_until_reset "+pr.AsDuration().String()+" ≠ "+or.AsDuration().String())
			}
		}
	}
	return out
}

func limitText(l *rlsv3.RateLimitResponse_RateLimit) string {
	if l == nil {
		return "none"
	}
	return strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10) + "/" + l.GetUnit().String() + " name " + strconv.Quote(l.GetName())
}

// metadataDifferences compares two answers' dynamic metadata (envoyproxy/ratelimit's
// RESPONSE_DYNAMIC_METADATA), with a limit override's text taken without its
// spaces: both write it as protobuf's text form, whose spacing the protobuf
// library varies on purpose from one binary to another
// (google.golang.org/protobuf/internal/detrand). Empty when they agree.
func metadataDifferences(peer, ours *rlsv3.RateLimitResponse) []string {
	p, o := normalMetadata(peer.GetDynamicMetadata().AsMap()), normalMetadata(ours.GetDynamicMetadata().AsMap())
	if reflect.DeepEqual(p, o) {
		return nil
	}
	return []string{fmt.Sprintf("dynamic_metadata %v ≠ %v", p, o)}
}

// normalMetadata is m with every descriptor's "limit" stripped of spaces.
func normalMetadata(m map[string]any) map[string]any {
	ds, _ := m["descriptors"].([]any)
	for _, d := range ds {
		if dm, ok := d.(map[string]any); ok {
			if l, ok := dm["limit"].(string); ok {
				dm["limit"] = strings.Join(strings.Fields(l), "")
			}
		}
	}
	return m
}
