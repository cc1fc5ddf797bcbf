package rlssource

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlsimport"
)

// FilesOptions configure NewFiles.
type FilesOptions struct {
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

// Files serves envoyproxy/ratelimit configuration files, read and re-read
// as envoyproxy/ratelimit reads them (its FILE config type,
// src/provider/file_provider.go, through github.com/lyft/goruntime's
// loader): every file under a directory, recursively, in lexical order, each
// one configuration file whatever its name; dot files and dot directories
// skipped when asked (a Kubernetes ConfigMap volume holds each file twice,
// once under a "..<timestamp>" directory). A change is noticed through
// fsnotify on the directory (and on its parent, where a deployment swaps a
// symlink) and by a re-read every FilesOptions.Resync; a re-read that finds
// the same bytes changes nothing.
type Files struct {
	*Served
	o FilesOptions
}

// NewFiles returns a Files that has read nothing yet; call Load, then Run.
func NewFiles(o FilesOptions) *Files {
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	return &Files{Served: newServed(o.Policy, o.MergeDomains, o.Dir, o.Registry, o.Logger), o: o}
}

// Load reads the files and serves them when they changed and import; it
// returns the import's error and keeps what it served before.
func (s *Files) Load() error {
	files, err := s.read()
	if err != nil {
		return s.failed(err)
	}
	return s.set(files)
}

// read returns the files as goruntime's loader walks them: lexical order,
// symlinks to files followed, symlinks to directories and unreadable entries
// skipped, names relative to the directory with "/" as ".".
func (s *Files) read() ([]rlsimport.File, error) {
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
func (s *Files) Run(ctx context.Context) {
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
