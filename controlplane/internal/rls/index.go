package rls

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Policies is where the service reads the current policies (snapshot.Snapshot).
type Policies interface {
	// Generation changes whenever List may answer differently.
	Generation() uint64
	// List returns the live policies.
	List() []store.Record
}

// ruleRef names one descriptor rule of a current policy.
type ruleRef struct {
	policy string
	rule   *rules.Rule
	// limit is the rule's current_limit, shared by every response (read-only).
	limit *rlsv3.RateLimitResponse_RateLimit
	// c counts its descriptors by result; use its policy's decisions.
	c   *resultCounters
	use *PolicyUse
}

// node is one level of a domain's descriptor tree, as envoyproxy/ratelimit
// builds it from its configuration (src/config/config_impl.go,
// loadDescriptors): children by exact (key, value), by trailing-wildcard value
// in the order first met, and by key alone; and the rule whose descriptor ends
// here, if any.
type node struct {
	exact map[entryKV]*node
	wild  []wildChild
	any   map[string]*node
	rule  *ruleRef
}

type entryKV struct{ key, value string }

type wildChild struct {
	key, prefix string
	n           *node
}

// index is the descriptor rules of every current policy, a tree per domain.
type index struct {
	gen     uint64
	domains map[string]*node
}

// indexer keeps an index for the policies' generation it was built at.
type indexer struct {
	p   Policies
	log *slog.Logger
	m   *metrics
	// uses are the policies' decision records, kept across rebuilds.
	uses sync.Map // policy name → *PolicyUse

	mu  sync.Mutex
	cur *index
}

// get returns the index of the current policies, building it when they changed.
func (x *indexer) get() *index {
	gen := x.p.Generation()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cur != nil && x.cur.gen == gen {
		return x.cur
	}
	x.cur = build(gen, x.p.List(), x.log, x.m)
	for _, n := range x.cur.domains {
		n.walk(func(r *ruleRef) {
			u, _ := x.uses.LoadOrStore(r.policy, &PolicyUse{})
			r.use = u.(*PolicyUse)
		})
	}
	return x.cur
}

// build indexes the descriptor rules of recs, in the order of recs (by policy
// name) and then of their rules. When two rules name one descriptor path the
// first is kept and the other logged: a policy's own validation refuses that
// within one policy, so it can only happen across policies.
func build(gen uint64, recs []store.Record, log *slog.Logger, m *metrics) *index {
	ix := &index{gen: gen, domains: make(map[string]*node)}
	for _, rec := range recs {
		p, err := rules.ParsePolicy(rec.Doc)
		if err != nil {
			continue // a stored document is valid; a broken one the quota service reports
		}
		for i := range p.Rules {
			r := &p.Rules[i]
			ds := r.Descriptor
			if ds == nil {
				continue
			}
			n := ix.domains[ds.Domain]
			if n == nil {
				n = &node{}
				ix.domains[ds.Domain] = n
			}
			for _, e := range ds.Entries {
				n = n.child(e)
			}
			if n.rule != nil {
				log.Warn("rls: two rules name the same descriptor; the first is served", "domain", ds.Domain,
					"served", n.rule.policy+"/"+n.rule.rule.ID, "ignored", p.Name+"/"+r.ID)
				continue
			}
			n.rule = &ruleRef{policy: p.Name, rule: r, limit: currentLimit(ds.Name, r.Limit, r.Window), c: m.forRule(ds.Domain, p.Name+"/"+r.ID)}
		}
	}
	return ix
}

// walk calls f with every rule of the tree below n.
func (n *node) walk(f func(*ruleRef)) {
	if n.rule != nil {
		f(n.rule)
	}
	for _, c := range n.exact {
		c.walk(f)
	}
	for _, c := range n.wild {
		c.n.walk(f)
	}
	for _, c := range n.any {
		c.walk(f)
	}
}

// PolicyUse is what this replica decided under one policy's descriptor
// rules: how many descriptors, and when last (Unix nanoseconds).
type PolicyUse struct {
	decisions, last atomic.Int64
}

// Use returns how many descriptors this replica has decided under a rule of
// policy and when it last did, false if it never has (since it started).
func (s *Server) Use(policy string) (decisions int64, last time.Time, ok bool) {
	v, found := s.ix.uses.Load(policy)
	if !found {
		return 0, time.Time{}, false
	}
	u := v.(*PolicyUse)
	n := u.decisions.Load()
	if n == 0 {
		return 0, time.Time{}, false
	}
	return n, time.Unix(0, u.last.Load()), true
}

// child returns n's child for e, adding it.
func (n *node) child(e rules.DescriptorEntry) *node {
	switch e.Specificity() {
	case 2:
		if n.exact == nil {
			n.exact = make(map[entryKV]*node)
		}
		k := entryKV{e.Key, e.Value}
		if n.exact[k] == nil {
			n.exact[k] = &node{}
		}
		return n.exact[k]
	case 1:
		prefix := strings.TrimSuffix(e.Value, "*")
		for _, w := range n.wild {
			if w.key == e.Key && w.prefix == prefix {
				return w.n
			}
		}
		c := &node{}
		n.wild = append(n.wild, wildChild{key: e.Key, prefix: prefix, n: c})
		return c
	}
	if n.any == nil {
		n.any = make(map[string]*node)
	}
	if n.any[e.Key] == nil {
		n.any[e.Key] = &node{}
	}
	return n.any[e.Key]
}

// lookup returns the rule a descriptor of domain names, or nil, walking the
// tree as envoyproxy/ratelimit's GetLimit does: at each entry the child of the
// exact (key, value), else the first wildcard child that accepts the value,
// else the child of the key alone; no step back when a deeper entry finds
// nothing. The rule counts only when it ends at the descriptor's last entry.
func (ix *index) lookup(domain string, entries []entryKV) *ruleRef {
	n := ix.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil
	}
	for _, e := range entries {
		next := n.exact[e]
		if next == nil {
			for _, w := range n.wild {
				if w.key == e.key && strings.HasPrefix(e.value, w.prefix) {
					next = w.n
					break
				}
			}
		}
		if next == nil {
			next = n.any[e.key]
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n.rule
}
