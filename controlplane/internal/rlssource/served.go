// Package rlssource is where the RateLimitService takes its rules when it runs
// as envoyproxy/ratelimit's drop-in (sluice-controlplane ratelimit): from
// envoyproxy/ratelimit configuration files (Files, its FILE config type) or
// from RateLimitConfig resources over xDS (XDS, its GRPC_XDS_SOTW config
// type). Both are imported with rlsimport into one policy, Served, which the
// rls and quota packages read as they read the store's policies. A
// configuration that does not import is refused and the last good one kept,
// logged and counted, as envoyproxy/ratelimit does
// (src/service/ratelimit.go, SetConfig).
package rlssource

import (
	"crypto/sha256"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlsimport"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Served is the policy a source last imported. It satisfies the policy
// readers of the rls and quota packages (Get, List, Generation).
type Served struct {
	name  string
	merge bool
	from  string // where the configuration comes from, for logs
	log   *slog.Logger
	epoch string
	gen   atomic.Uint64
	cur   atomic.Pointer[loaded]

	mu      sync.Mutex // serializes set
	sum     [sha256.Size]byte
	lastErr error // set's answer for sum

	loads *prometheus.CounterVec
}

// loaded is one configuration that imported.
type loaded struct {
	rec    store.Record
	policy *rules.Policy
	files  []string
}

// newServed returns a Served holding nothing, its policy named policy
// (default "ratelimit"), merging domains across files when merge.
func newServed(policy string, merge bool, from string, reg prometheus.Registerer, log *slog.Logger) *Served {
	if policy == "" {
		policy = "ratelimit"
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Served{name: policy, merge: merge, from: from, log: log, epoch: store.NewEpoch()}
	s.loads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_config_loads_total",
		Help: "Rate limit configurations received that differ from the last, by result: ok (now served) or error (refused; the last good one kept)."},
		[]string{"result"})
	if reg != nil {
		reg.MustRegister(s.loads)
	}
	s.loads.WithLabelValues("ok")
	s.loads.WithLabelValues("error")
	return s
}

// Loaded reports whether a configuration has imported.
func (s *Served) Loaded() bool { return s.cur.Load() != nil }

// Policy returns the policy served, nil before one loads.
func (s *Served) Policy() *rules.Policy {
	if l := s.cur.Load(); l != nil {
		return l.policy
	}
	return nil
}

// Get returns the record of the policy named name, false if it is not the
// one served or none has loaded.
func (s *Served) Get(name string) (store.Record, bool) {
	l := s.cur.Load()
	if l == nil || name != l.rec.Name {
		return store.Record{}, false
	}
	return l.rec, true
}

// List returns the policy served, none before one loads.
func (s *Served) List() []store.Record {
	if l := s.cur.Load(); l != nil {
		return []store.Record{l.rec}
	}
	return nil
}

// Generation changes whenever another configuration is served.
func (s *Served) Generation() uint64 { return s.gen.Load() }

// Files returns the names of the files (or xDS resources) served, in order.
func (s *Served) Files() []string {
	if l := s.cur.Load(); l != nil {
		return slices.Clone(l.files)
	}
	return nil
}

// set imports files and serves them when they differ from the last set
// received. It returns the import's error (each problem
// "file:line: field: message"), keeping what it served before; the same bad
// set received again gets the same error and is not counted again.
func (s *Served) set(files []rlsimport.File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := sha256.New()
	for _, f := range files {
		h.Write([]byte(f.Name))
		h.Write([]byte{0})
		h.Write([]byte(strconv.Itoa(len(f.Data))))
		h.Write([]byte{0})
		h.Write(f.Data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if sum == s.sum {
		return s.lastErr
	}
	s.sum = sum
	res, err := rlsimport.Import(s.name, files, rlsimport.Options{MergeDomains: s.merge})
	if s.lastErr = err; err != nil {
		return s.failed(err)
	}
	version := uint64(1)
	if l := s.cur.Load(); l != nil {
		version = l.rec.Version + 1
	}
	res.Policy.Version = version
	doc := rules.EncodePolicy(res.Policy)
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.Name
	}
	s.cur.Store(&loaded{rec: store.Record{Name: s.name, Version: version, Doc: doc, Epoch: s.epoch, Sum: store.Sum(doc)},
		policy: res.Policy, files: names})
	s.gen.Add(1)
	s.loads.WithLabelValues("ok").Inc()
	for _, n := range res.Notes {
		s.log.Info("rate limit configuration: note", "note", n)
	}
	s.log.Info("rate limit configuration loaded", "from", s.from, "files", len(files), "rules", len(res.Policy.Rules), "version", version)
	return nil
}

// failed counts and logs a configuration refused.
func (s *Served) failed(err error) error {
	s.loads.WithLabelValues("error").Inc()
	kept := "none"
	if l := s.cur.Load(); l != nil {
		kept = "version " + strconv.FormatUint(l.rec.Version, 10)
	}
	s.log.Error("rate limit configuration refused; the last good one is served", "from", s.from, "served", kept, "err", err)
	return err
}

// Dump returns the limits served, one line each, as envoyproxy/ratelimit's
// debug endpoint /rlconfig prints them (src/config/config_impl.go, dump):
// "<domain>.<key>[_<value>]....: unit=<UNIT> requests_per_unit=<n>,
// shadow_mode: <bool>, quota_mode: <bool>"; an unlimited descriptor's unit
// is UNKNOWN and a whitelisted one has no line. Lines are sorted (upstream's
// order is a map's).
func (s *Served) Dump() string {
	p := s.Policy()
	if p == nil {
		return ""
	}
	var lines []string
	for i := range p.Rules {
		r := &p.Rules[i]
		ds := r.Descriptor
		if ds == nil || ds.NoLimit {
			continue
		}
		key := ds.Domain
		for _, e := range ds.Entries {
			key += "." + e.Key
			if e.Value != "" {
				key += "_" + e.Value
			}
		}
		unit, rpu := "UNKNOWN", uint64(0)
		if !ds.Unlimited {
			unit, rpu = unitName(r.Window), r.Limit
		}
		lines = append(lines, key+": unit="+unit+" requests_per_unit="+strconv.FormatUint(rpu, 10)+
			", shadow_mode: "+strconv.FormatBool(r.Shadow)+", quota_mode: "+strconv.FormatBool(ds.QuotaMode)+"\n")
	}
	slices.Sort(lines)
	return strings.Join(lines, "")
}

// unitName is the unit of a window, as the RateLimitResponse's Unit enum names it.
func unitName(w time.Duration) string {
	for name, d := range rlsimport.Units {
		if d == w {
			return strings.ToUpper(name)
		}
	}
	return "UNKNOWN"
}
