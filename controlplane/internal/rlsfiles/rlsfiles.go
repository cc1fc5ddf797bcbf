// Package rlsfiles serves envoyproxy/ratelimit configuration files as the
// policy the RateLimitService decides by, read and re-read as
// envoyproxy/ratelimit reads them (its FILE config type,
// src/provider/file_provider.go, through github.com/lyft/goruntime's loader):
// every file under a directory, recursively, in lexical order, each one
// configuration file whatever its name; dot files and dot directories skipped
// when asked (a Kubernetes ConfigMap volume holds each file twice, once
// under a "..<timestamp>" directory). The files are imported with rlsimport
// into one policy; a set that does not import keeps the last one that did,
// logged and counted, as there.
//
// A change is noticed through fsnotify on the directory (and, watching the
// root, on its parent, where a deployment swaps a symlink), and by a re-read
// every Options.Resync; a re-read that finds the same bytes changes nothing.
package rlsfiles

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlsimport"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Options configure New.
type Options struct {
	// Dir is the directory read (rlsenv.Settings.Dir). Required.
	Dir string
	// AppDir, when set, reads only the files under Dir/AppDir (the root
	// watched: RUNTIME_WATCH_ROOT).
	AppDir string
	// IgnoreDotFiles skips files and directories whose name starts with "."
	// (RUNTIME_IGNOREDOTFILES).
	IgnoreDotFiles bool
	// MergeDomains lets several files name one domain (MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// Policy names the policy served (default "ratelimit").
	Policy string
	// Resync is how often the files are read again even without a change
	// event (default 30s).
	Resync time.Duration
	// Registry receives the metrics; nil registers none.
	Registry prometheus.Registerer
	// Logger receives loads and failures; nil means slog.Default().
	Logger *slog.Logger
}

// Source is the policy of the files. It satisfies the policy readers of
// the rls and quota packages (Get, List, Generation).
type Source struct {
	o     Options
	log   *slog.Logger
	epoch string
	gen   atomic.Uint64
	cur   atomic.Pointer[loaded]

	mu  sync.Mutex // serializes loads
	sum [sha256.Size]byte

	loads *prometheus.CounterVec
}

// loaded is one set of files that imported.
type loaded struct {
	rec    store.Record
	policy *rules.Policy
	files  []string
}

// New returns a Source that has read nothing yet; call Load, then Run.
func New(o Options) *Source {
	if o.Policy == "" {
		o.Policy = "ratelimit"
	}
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Source{o: o, log: o.Logger, epoch: store.NewEpoch()}
	s.loads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_rls_config_loads_total",
		Help: "Reads of the rate limit configuration files that changed them, by result: ok (now served) or error (the last good configuration kept)."},
		[]string{"result"})
	if o.Registry != nil {
		o.Registry.MustRegister(s.loads)
	}
	s.loads.WithLabelValues("ok")
	s.loads.WithLabelValues("error")
	return s
}

// Loaded reports whether a set of files has imported.
func (s *Source) Loaded() bool { return s.cur.Load() != nil }

// Policy returns the policy served, nil before one loads.
func (s *Source) Policy() *rules.Policy {
	if l := s.cur.Load(); l != nil {
		return l.policy
	}
	return nil
}

// Get returns the record of the policy named name, false if it is not the
// one served or none has loaded.
func (s *Source) Get(name string) (store.Record, bool) {
	l := s.cur.Load()
	if l == nil || name != l.rec.Name {
		return store.Record{}, false
	}
	return l.rec, true
}

// List returns the policy served, none before one loads.
func (s *Source) List() []store.Record {
	if l := s.cur.Load(); l != nil {
		return []store.Record{l.rec}
	}
	return nil
}

// Generation changes whenever a new set of files is served.
func (s *Source) Generation() uint64 { return s.gen.Load() }

// Load reads the files and serves them when they changed and import; it
// returns the import's error (the files named, each problem
// "file:line: field: message") and keeps what it served before.
func (s *Source) Load() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	files, err := s.read()
	if err != nil {
		return s.failed(err)
	}
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
	if sum == s.sum && s.cur.Load() != nil {
		return nil
	}
	res, err := rlsimport.Import(s.o.Policy, files, rlsimport.Options{MergeDomains: s.o.MergeDomains})
	if err != nil {
		s.sum = sum // the same bad bytes are not reported again at every resync
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
	s.cur.Store(&loaded{rec: store.Record{Name: s.o.Policy, Version: version, Doc: doc, Epoch: s.epoch, Sum: store.Sum(doc)},
		policy: res.Policy, files: names})
	s.gen.Add(1)
	s.sum = sum
	s.loads.WithLabelValues("ok").Inc()
	for _, n := range res.Notes {
		s.log.Info("rate limit configuration: note", "note", n)
	}
	s.log.Info("rate limit configuration loaded", "dir", s.o.Dir, "files", len(files), "rules", len(res.Policy.Rules), "version", version)
	return nil
}

func (s *Source) failed(err error) error {
	s.loads.WithLabelValues("error").Inc()
	kept := "none"
	if l := s.cur.Load(); l != nil {
		kept = "version " + strconv.FormatUint(l.rec.Version, 10)
	}
	s.log.Error("rate limit configuration not loaded; the last good one is served", "dir", s.o.Dir, "served", kept, "err", err)
	return err
}

// read returns the files as goruntime's loader walks them: lexical order,
// symlinks to files followed, symlinks to directories and unreadable entries
// skipped, names relative to the directory with "/" as ".".
func (s *Source) read() ([]rlsimport.File, error) {
	root := filepath.Clean(s.o.Dir)
	if _, err := os.Stat(root); err != nil {
		return nil, err
	}
	var files []rlsimport.File
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			s.log.Warn("rate limit configuration: skipped", "path", path, "err", err)
			return nil
		}
		dot := s.o.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") && path != root
		if d.IsDir() {
			if dot {
				return filepath.SkipDir
			}
			return nil
		}
		if dot {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if s.o.AppDir != "" && !strings.HasPrefix(rel, s.o.AppDir+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil { // a symlink to a directory, or gone meanwhile
			return nil
		}
		files = append(files, rlsimport.File{Name: strings.ReplaceAll(rel, string(filepath.Separator), "."), Data: b})
		return nil
	})
	return files, err
}

// Run re-reads the files on every change event and every Resync until ctx
// ends. Without fsnotify (too many watches, say) it logs why and re-reads
// every Resync only.
func (s *Source) Run(ctx context.Context) {
	events := make(chan struct{}, 1)
	if w, err := fsnotify.NewWatcher(); err != nil {
		s.log.Warn("rate limit configuration: no change events; re-reading every resync", "err", err, "resync", s.o.Resync.String())
	} else {
		defer w.Close()
		dirs := []string{s.o.Dir, filepath.Dir(filepath.Clean(s.o.Dir))}
		if s.o.AppDir != "" {
			dirs = append(dirs, filepath.Join(s.o.Dir, s.o.AppDir))
		}
		for _, d := range dirs {
			if err := w.Add(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("rate limit configuration: not watched", "dir", d, "err", err)
			}
		}
		go forward(ctx, w, events)
	}
	t := time.NewTicker(s.o.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
		case <-t.C:
		}
		_ = s.Load()
	}
}

// forward turns the watcher's events into at most one pending signal.
func forward(ctx context.Context, w *fsnotify.Watcher, events chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.Events:
			if !ok {
				return
			}
			select {
			case events <- struct{}{}:
			default:
			}
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
		}
	}
}

// Files returns the names of the files served, in the order read.
func (s *Source) Files() []string {
	if l := s.cur.Load(); l != nil {
		return slices.Clone(l.files)
	}
	return nil
}

// Dump returns the limits served, one line each, as envoyproxy/ratelimit's
// debug endpoint /rlconfig prints them (src/config/config_impl.go, dump):
// "<domain>.<key>[_<value>]....: unit=<UNIT> requests_per_unit=<n>,
// shadow_mode: <bool>, quota_mode: <bool>"; an unlimited descriptor's unit
// is UNKNOWN and a whitelisted one has no line. Lines are sorted (upstream's
// order is a map's).
func (s *Source) Dump() string {
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
