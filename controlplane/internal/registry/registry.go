// Package registry remembers which Envoys poll the control plane: for each
// (policy, node) pair, the policy version the Envoy's filter runs, its
// plugin build and when it was last seen. GET /v1/policies/{policy}/status
// and sluicectl status read it, like istioctl proxy-status reads Istio's.
//
// The filter's long poll identifies its Envoy with request headers
// (x-sluice-node, x-sluice-version, x-sluice-build; see
// filter/internal/policysync). Anyone holding a read token can send them,
// so the registry is bounded: at most Options.MaxEntries entries (the least
// recently seen is evicted first), each expiring Options.ExpireAfter after
// it was last seen, and every field clipped to a fixed length.
//
// The registry lives in this replica's memory: it survives store outages as
// reads do, but with several replicas an Envoy polls one of them, so a
// replica reports the Envoys that poll it.
package registry

import (
	"container/list"
	"sort"
	"strings"
	"sync"
	"time"
)

// Defaults for the Options fields left zero.
const (
	// DefaultMaxEntries bounds the entries (policy, node pairs).
	DefaultMaxEntries = 10000
	// DefaultExpireAfter is how long an entry is kept after it was last
	// seen: 10 minutes.
	DefaultExpireAfter = 10 * time.Minute
	// MaxFieldBytes is the longest node, version or build kept; longer
	// values are clipped.
	MaxFieldBytes = 128
)

// Options configure New.
type Options struct {
	// MaxEntries bounds the entries; 0 means DefaultMaxEntries.
	MaxEntries int
	// ExpireAfter is how long an entry outlives its last sighting; 0 means
	// DefaultExpireAfter.
	ExpireAfter time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Entry is what the registry knows of one Envoy for one policy.
type Entry struct {
	// Policy is the policy the Envoy's filter pulls.
	Policy string
	// Node is the Envoy's node id (Envoy's node.id, read by the filter as
	// the property xds.node.id).
	Node string
	// Version is the entity tag of the policy version the filter runs, as
	// the control plane served it ("\"v7.<epoch>.<sum>\""); empty if it has
	// applied none yet.
	Version string
	// Build is the filter's build string; empty if not sent.
	Build string
	// Address is the IP address the poll came from.
	Address string
	// LastSeen is when its last poll started or ended.
	LastSeen time.Time
	// Polling is true while one of its long polls is open on this replica:
	// the Envoy is connected now.
	Polling bool
}

type entry struct {
	Entry
	open int // polls open now
	elem *list.Element
}

// Registry is the bounded, expiring set of Envoys. It is safe for
// concurrent use.
type Registry struct {
	o       Options
	mu      sync.Mutex
	entries map[string]*entry // key: policy + "\x00" + node
	lru     *list.List        // of *entry, most recently seen at the front
	evicted uint64
}

// New returns an empty registry.
func New(o Options) *Registry {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.ExpireAfter <= 0 {
		o.ExpireAfter = DefaultExpireAfter
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Registry{o: o, entries: map[string]*entry{}, lru: list.New()}
}

// Clip returns s cut to MaxFieldBytes with control and non-ASCII bytes
// dropped, so that a header's value is safe to keep, log and print.
func Clip(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < MaxFieldBytes; i++ {
		if c := s[i]; c > 0x20 && c < 0x7f {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Begin records that e.Policy's Envoy e.Node started a poll now (e's
// Version, Build and Address replace the ones known) and returns the
// function that records its end. Fields are clipped (Clip); an empty node
// is not recorded.
func (r *Registry) Begin(e Entry) (end func()) {
	e.Node, e.Version, e.Build, e.Address = Clip(e.Node), Clip(e.Version), Clip(e.Build), Clip(e.Address)
	if e.Node == "" {
		return func() {}
	}
	key := e.Policy + "\x00" + e.Node
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.o.Now()
	r.expire(now)
	en := r.entries[key]
	if en == nil {
		en = &entry{}
		en.elem = r.lru.PushFront(en)
		r.entries[key] = en
		for r.lru.Len() > r.o.MaxEntries {
			r.remove(r.lru.Back().Value.(*entry))
			r.evicted++
		}
	} else {
		r.lru.MoveToFront(en.elem)
	}
	open := en.open + 1
	en.Entry, en.open = e, open
	en.LastSeen = now
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if cur := r.entries[key]; cur == en {
			en.open--
			en.LastSeen = r.o.Now()
			r.lru.MoveToFront(en.elem)
		}
	}
}

func (r *Registry) remove(en *entry) {
	r.lru.Remove(en.elem)
	delete(r.entries, en.Policy+"\x00"+en.Node)
}

// expire drops the entries last seen more than ExpireAfter ago that have
// no poll open (the least recently seen are at the back).
func (r *Registry) expire(now time.Time) {
	for el := r.lru.Back(); el != nil; {
		en := el.Value.(*entry)
		if now.Sub(en.LastSeen) <= r.o.ExpireAfter {
			return
		}
		prev := el.Prev()
		if en.open == 0 {
			r.remove(en)
		}
		el = prev
	}
}

// Policy returns the entries of policy, sorted by node; an entry with a
// poll open has Polling set.
func (r *Registry) Policy(policy string) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(r.o.Now())
	var out []Entry
	for _, en := range r.entries {
		if en.Policy == policy {
			e := en.Entry
			e.Polling = en.open > 0
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// All returns every entry, sorted by policy then node.
func (r *Registry) All() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(r.o.Now())
	out := make([]Entry, 0, len(r.entries))
	for _, en := range r.entries {
		e := en.Entry
		e.Polling = en.open > 0
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Policy != out[j].Policy {
			return out[i].Policy < out[j].Policy
		}
		return out[i].Node < out[j].Node
	})
	return out
}

// Len returns the number of entries, and how many were evicted for room
// since New.
func (r *Registry) Len() (entries int, evicted uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries), r.evicted
}
