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

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice-devproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "envoy/envoy.yaml", "Envoy bootstrap to follow")
	wasmPath := fs.String("wasm", "", "the filter module (default: the file's vm_config.code.local.filename)")
	listen := fs.String("listen", "", "listen address host:port (default: the file's listener)")
	upstream := fs.String("upstream", "", "address host:port of the route's cluster (default: the file's)")
	clusters := clusterFlags{}
	fs.Var(clusters, "cluster", "name=host:port: the address of a cluster (repeatable)")
	workers := fs.Int("workers", 2, "worker VMs (Envoy --concurrency)")
	accessLog := fs.String("access-log", "", "access-log file (default: the file's path; - for stdout)")
	readToken := fs.String("read-token", os.Getenv("SLUICE_READ_TOKEN"), "control-plane read token: the VM variable control_plane.token_env names, else control_plane.token (default $SLUICE_READ_TOKEN; empty keeps what the file and host_env_keys give)")
	serviceNode := fs.String("service-node", "", "node id (Envoy's --service-node; default: the file's node.id), the filter's xds.node.id")
	quotaToken := fs.String("quota-token", os.Getenv("SLUICE_QUOTA_TOKEN"), "control-plane quota token: the VM variable control_plane.quota_token_env names, else control_plane.quota_token (default $SLUICE_QUOTA_TOKEN; empty keeps what the file and host_env_keys give)")
	noFilter := fs.Bool("no-filter", false, "forward without the filter (a baseline for benchmarks)")
	logLevel := fs.String("log-level", "info", "guest and proxy log level: debug, info, warn, error")
	admin := fs.String("admin", "", "admin address host:port serving /ready, /stats and /stats/prometheus (default: the file's admin.address; off: none)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stderr, "sluice-devproxy", version.String())
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "sluice-devproxy: --log-level %q: %v\n", *logLevel, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice-devproxy: %v\n", err)
		return 1
	}

	cfg, err := devproxy.LoadEnvoyConfig(*cfgPath)
	if err != nil {
		return fail(err)
	}
	o := devproxy.Options{Config: cfg, Workers: *workers, Upstream: *upstream, Clusters: clusters,
		ReadToken: *readToken, QuotaToken: *quotaToken, Logger: logger, LogLevel: guestLevel(lvl), NodeID: *serviceNode}
	if !*noFilter && cfg.Filter != nil {
		path := *wasmPath
		if path == "" {
			path = cfg.Filter.WasmFile
		}
		if o.Wasm, err = os.ReadFile(path); err != nil {
			return fail(fmt.Errorf("reading the filter: %w (build it with `make wasm`)", err))
		}
	}
	logPath := *accessLog
	if logPath == "" && cfg.AccessLog != nil {
		logPath = cfg.AccessLog.Path
	}
	switch logPath {
	case "":
	case "-", "/dev/stdout":
		o.AccessLog = os.Stdout
	default:
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		o.AccessLog = f
	}
	addr := cfg.Listen
	if *listen != "" {
		addr = *listen
	}

	fmt.Fprintf(stderr, "sluice-devproxy: following %s\n", *cfgPath)
	for _, h := range cfg.Honoured {
		fmt.Fprintf(stderr, "  honoured: %s\n", h)
	}
	for _, h := range cfg.Ignored {
		fmt.Fprintf(stderr, "  ignored:  %s\n", h)
	}
	if *noFilter {
		fmt.Fprintln(stderr, "  ignored:  the wasm filter (--no-filter)")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := devproxy.New(ctx, o)
	if err != nil {
		return fail(err) // the guest's own log lines, above, say why
	}
	defer p.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "sluice-devproxy: listening on http://%s, upstream %s, %d workers, access log %s\n",
		ln.Addr(), p.Upstream(), *workers, orNone(logPath))
	adminAddr := cfg.Admin
	if *admin != "" {
		adminAddr = *admin
	}
	if adminAddr != "" && adminAddr != "off" {
		// Envoy refuses to start when its admin port is taken; the dev proxy goes on
		// without it (several dev proxies often share one file), and says so.
		if al, err := net.Listen("tcp", adminAddr); err != nil {
			fmt.Fprintf(stderr, "sluice-devproxy: admin interface not served: %v (set --admin to another address)\n", err)
		} else {
			asrv := &http.Server{Handler: p.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = asrv.Serve(al) }()
			defer asrv.Close()
			fmt.Fprintf(stderr, "sluice-devproxy: admin on http://%s (/ready, /stats, /stats/prometheus)\n", al.Addr())
		}
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
