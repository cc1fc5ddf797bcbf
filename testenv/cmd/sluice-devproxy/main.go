// Command sluice-devproxy serves HTTP through the real sluice.wasm on the
// testenv host, configured from an Envoy bootstrap (default
// envoy/envoy.yaml): see package devproxy. At start it prints what of the
// Envoy file it honours and what it ignores; it stops cleanly on SIGINT or
// SIGTERM.
//
//	sluice-devproxy --config envoy/envoy.yaml --wasm build/sluice.wasm \
//	    --access-log build/run/access.log --read-token "$SLUICE_READ_TOKEN"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/version"
	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/host"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// clusterFlags collects repeated --cluster name=host:port.
type clusterFlags map[string]string

func (c clusterFlags) String() string { return fmt.Sprint(map[string]string(c)) }

func (c clusterFlags) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want name=host:port, got %q", v)
	}
	c[name] = addr
	return nil
}

// flags are the command's flags.
type flags struct {
	cfgPath, wasmPath, listen, upstream, accessLog string
	readToken, serviceNode, quotaToken             string
	logLevel, admin                                string
	clusters                                       clusterFlags
	workers                                        int
	noFilter, showVersion                          bool
}

// parseFlags reads args; false with the exit code when the command ends here
// (help, a bad flag).
func parseFlags(args []string, stderr io.Writer) (*flags, int, bool) {
	f := &flags{clusters: clusterFlags{}}
	fs := flag.NewFlagSet("sluice-devproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.cfgPath, "config", "envoy/envoy.yaml", "Envoy bootstrap to follow")
	fs.StringVar(&f.wasmPath, "wasm", "", "the filter module (default: the file's vm_config.code.local.filename)")
	fs.StringVar(&f.listen, "listen", "", "listen address host:port (default: the file's listener)")
	fs.StringVar(&f.upstream, "upstream", "", "address host:port of the route's cluster (default: the file's)")
	fs.Var(f.clusters, "cluster", "name=host:port: the address of a cluster (repeatable)")
	fs.IntVar(&f.workers, "workers", 2, "worker VMs (Envoy --concurrency)")
	fs.StringVar(&f.accessLog, "access-log", "", "access-log file (default: the file's path; - for stdout)")
	fs.StringVar(&f.readToken, "read-token", os.Getenv("SLUICE_READ_TOKEN"), "control-plane read token: the VM variable control_plane.token_env names, else control_plane.token (default $SLUICE_READ_TOKEN; empty keeps what the file and host_env_keys give)")
	fs.StringVar(&f.serviceNode, "service-node", "", "node id (Envoy's --service-node; default: the file's node.id), the filter's xds.node.id")
	fs.StringVar(&f.quotaToken, "quota-token", os.Getenv("SLUICE_QUOTA_TOKEN"), "control-plane quota token: the VM variable control_plane.quota_token_env names, else control_plane.quota_token (default $SLUICE_QUOTA_TOKEN; empty keeps what the file and host_env_keys give)")
	fs.BoolVar(&f.noFilter, "no-filter", false, "forward without the filter (a baseline for benchmarks)")
	fs.StringVar(&f.logLevel, "log-level", "info", "guest and proxy log level: debug, info, warn, error")
	fs.StringVar(&f.admin, "admin", "", "admin address host:port serving /ready, /stats and /stats/prometheus (default: the file's admin.address; off: none)")
	fs.BoolVar(&f.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, 2, false
	}
	return f, 0, true
}

func run(args []string, stderr io.Writer) int {
	f, code, ok := parseFlags(args, stderr)
	if !ok {
		return code
	}
	if f.showVersion {
		fmt.Fprintln(stderr, "sluice-devproxy", version.String())
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "sluice-devproxy: --log-level %q: %v\n", f.logLevel, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice-devproxy: %v\n", err)
		return 1
	}
	cfg, err := devproxy.LoadEnvoyConfig(f.cfgPath)
	if err != nil {
		return fail(err)
	}
	o, closeLog, err := f.options(cfg, logger, guestLevel(lvl))
	if err != nil {
		return fail(err)
	}
	defer closeLog()
	f.describe(stderr, cfg)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := devproxy.New(ctx, o)
	if err != nil {
		return fail(err) // the guest's own log lines, above, say why
	}
	defer p.Close()
	addr := cfg.Listen
	if f.listen != "" {
		addr = f.listen
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "sluice-devproxy: listening on http://%s, upstream %s, %d workers, access log %s\n",
		ln.Addr(), p.Upstream(), f.workers, orNone(f.logPath(cfg)))
	if closeAdmin := f.serveAdmin(stderr, cfg, p); closeAdmin != nil {
		defer closeAdmin()
	}
	select {
	case err := <-errc:
		return fail(err)
	case <-ctx.Done():
	}
	fmt.Fprintln(stderr, "sluice-devproxy: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	return 0
}

// logPath is the access-log file: --access-log, else the file's ("" none).
func (f *flags) logPath(cfg *devproxy.EnvoyConfig) string {
	if f.accessLog == "" && cfg.AccessLog != nil {
		return cfg.AccessLog.Path
	}
	return f.accessLog
}

// options are the dev proxy's options from the flags and the file: the module
// read, the access log opened (closeLog closes it).
func (f *flags) options(cfg *devproxy.EnvoyConfig, logger *slog.Logger, guest host.LogLevel) (o devproxy.Options, closeLog func(), err error) {
	o = devproxy.Options{Config: cfg, Workers: f.workers, Upstream: f.upstream, Clusters: f.clusters,
		ReadToken: f.readToken, QuotaToken: f.quotaToken, Logger: logger, LogLevel: guest, NodeID: f.serviceNode}
	closeLog = func() {}
	if !f.noFilter && cfg.Filter != nil {
		path := f.wasmPath
		if path == "" {
			path = cfg.Filter.WasmFile
		}
		if o.Wasm, err = os.ReadFile(path); err != nil {
			return o, closeLog, fmt.Errorf("reading the filter: %w (build it with `make wasm`)", err)
		}
	}
	switch logPath := f.logPath(cfg); logPath {
	case "":
	case "-", "/dev/stdout":
		o.AccessLog = os.Stdout
	default:
		file, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return o, closeLog, err
		}
		o.AccessLog, closeLog = file, func() { file.Close() }
	}
	return o, closeLog, nil
}

// describe says which file the proxy follows, and what of it it honours and
// ignores.
func (f *flags) describe(stderr io.Writer, cfg *devproxy.EnvoyConfig) {
	fmt.Fprintf(stderr, "sluice-devproxy: following %s\n", f.cfgPath)
	for _, h := range cfg.Honoured {
		fmt.Fprintf(stderr, "  honoured: %s\n", h)
	}
	for _, h := range cfg.Ignored {
		fmt.Fprintf(stderr, "  ignored:  %s\n", h)
	}
	if f.noFilter {
		fmt.Fprintln(stderr, "  ignored:  the wasm filter (--no-filter)")
	}
}

// serveAdmin serves the admin interface (--admin, else the file's) and returns
// its closer, or nil when there is none. Envoy refuses to start when its admin
// port is taken; the dev proxy goes on without it (several dev proxies often
// share one file), and says so.
func (f *flags) serveAdmin(stderr io.Writer, cfg *devproxy.EnvoyConfig, p *devproxy.Proxy) func() {
	adminAddr := cfg.Admin
	if f.admin != "" {
		adminAddr = f.admin
	}
	if adminAddr == "" || adminAddr == "off" {
		return nil
	}
	al, err := net.Listen("tcp", adminAddr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-devproxy: admin interface not served: %v (set --admin to another address)\n", err)
		return nil
	}
	asrv := &http.Server{Handler: p.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = asrv.Serve(al) }()
	fmt.Fprintf(stderr, "sluice-devproxy: admin on http://%s (/ready, /stats, /stats/prometheus)\n", al.Addr())
	return func() { asrv.Close() }
}

func guestLevel(l slog.Level) host.LogLevel {
	switch {
	case l <= slog.LevelDebug:
		return host.LogDebug
	case l <= slog.LevelInfo:
		return host.LogInfo
	case l <= slog.LevelWarn:
		return host.LogWarn
	}
	return host.LogError
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
