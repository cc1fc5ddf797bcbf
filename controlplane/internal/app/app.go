// Package app wires the control plane together: settings → store →
// snapshot → API server → HTTP listener, and the graceful shutdown.
//
// # Failure policy
//
// Bad settings, an unopenable embedded store (missing permissions, locked by
// another process, or an existing file that is not a valid store: empty,
// truncated or damaged, see boltstore) or an unusable listen address stop
// the binary at start with exit code 1 and an error naming the file. An unreachable Redis does not: the service starts
// unready and recovers by itself. On SIGINT/SIGTERM it stops accepting
// connections, answers open long polls at once (304), finishes in-flight
// requests within the shutdown timeout, then closes the store.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/boltstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/config"
	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/redisstore"
	"github.com/sluice-proxy/sluice/controlplane/internal/registry"
	"github.com/sluice-proxy/sluice/controlplane/internal/rlqs"
	"github.com/sluice-proxy/sluice/controlplane/internal/rls"
	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/tlsconf"
	"github.com/sluice-proxy/sluice/shared/rules"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/yaml"
)

// Main runs the binary: it parses args and the environment, serves until
// SIGINT or SIGTERM, and returns the exit code (0 ok, 1 failure, 2 usage).
func Main(args []string, getenv func(string) string, stderr io.Writer) int {
	s, err := config.Parse(args, getenv, os.ReadFile, stderr)
	if errors.Is(err, config.ErrHelp) || errors.Is(err, config.ErrVersion) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-controlplane:", err)
		return 2
	}
	log := NewLogger(s, stderr)
	return untilSignal(log, "sluice-controlplane", func(ctx context.Context) error { return Run(ctx, s, log, nil) })
}

// untilSignal makes log the default logger and runs run until it returns or
// SIGINT or SIGTERM ends its context: exit code 0, or 1 with the error logged
// as what stopping.
func untilSignal(log *slog.Logger, what string, run func(context.Context) error) int {
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Error(what+" stopped", "err", err)
		return 1
	}
	return 0
}

// NewLogger returns the slog logger the settings ask for, writing to w.
func NewLogger(s config.Settings, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(s.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if s.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// OpenStore opens the store the settings select.
func OpenStore(s config.Settings) (store.Store, string, error) {
	if s.RedisURL != "" {
		redisstore.SetLogger(slog.Default())
		st, err := redisstore.Open(redisstore.Options{URL: s.RedisURL, MasterName: s.RedisMasterName, HistoryDepth: s.HistoryDepth,
			WaitReplicas: s.RedisWaitReplicas, WaitTimeout: s.RedisWaitTimeout})
		return st, "redis", err
	}
	st, err := boltstore.Open(boltstore.Options{Dir: s.DataDir, HistoryDepth: s.HistoryDepth, ResetDamaged: s.ResetDamagedStore})
	if err != nil {
		return nil, "embedded", err
	}
	if st.MovedAside() != "" {
		slog.Error("the embedded store file was damaged: moved aside, starting with NO policies (--reset-damaged-store); restore them, then remove the flag",
			"moved_to", st.MovedAside(), "store", st.Path())
	}
	return st, "embedded", nil
}

// Run serves until ctx is done, then shuts down gracefully. If listening is
// not nil it is called with the bound address once the listener is open.
// The steps: open the store and keep its snapshot fresh, build the API and the
// quota service, listen (REST, and gRPC and metrics when asked), serve, drain.
func Run(ctx context.Context, s config.Settings, log *slog.Logger, listening func(net.Addr)) error {
	st, kind, err := OpenStore(s)
	if err != nil {
		return err
	}
	defer st.Close()
	snap, stopSnap := startSnapshot(ctx, s, st, kind, log)
	defer stopSnap()
	reg := prometheus.NewRegistry()
	var rsRef atomic.Pointer[rls.Server] // set once the gRPC listener serves
	srv := newAPI(s, st, snap, reg, log, func(p string) (int64, time.Time, bool) {
		if rs := rsRef.Load(); rs != nil {
			return rs.Use(p)
		}
		return 0, time.Time{}, false
	})
	if s.BootstrapPolicy != "" {
		doc, err := readBootstrap(s.BootstrapPolicy)
		if err != nil {
			return err
		}
		go bootstrap(ctx, srv, doc, s.ResyncInterval, log)
	}
	qsvc, recalls, closeQuota, err := NewQuota(s, snap, reg, log)
	if err != nil {
		return err
	}
	defer closeQuota()
	tlsSrv, err := newTLS(s, reg, log)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.Listen, err)
	}
	hs := newHTTPServer(s, srv, qsvc, tlsSrv, log)
	logListening(s, l.Addr(), kind, tlsSrv != nil, log)
	if listening != nil {
		listening(l.Addr())
	}
	var gs *grpc.Server
	var rs *rls.Server
	if s.GRPCListen != "" {
		if gs, rs, err = serveGRPC(ctx, s, qsvc, recalls, snap, tlsSrv, reg, log); err != nil {
			l.Close()
			return err
		}
		rsRef.Store(rs)
		defer gs.Stop()
	}
	if s.MetricsListen != "" {
		ms, err := serveMetrics(s.MetricsListen, srv, log)
		if err != nil {
			l.Close()
			return err
		}
		defer ms.Close()
	}
	serveErr := make(chan error, 1)
	go func() {
		if tlsSrv != nil {
			serveErr <- hs.ServeTLS(l, "", "") // the certificate comes from hs.TLSConfig
			return
		}
		serveErr <- hs.Serve(l)
	}()
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	return shutdown(s, srv, hs, gs, rs, log)
}

// startSnapshot builds the snapshot of st, resyncs it once before serving (so
// a reachable store is served fresh from the first request; failing is not
// fatal) and keeps it fresh until stop is called.
func startSnapshot(ctx context.Context, s config.Settings, st store.Store, kind string, log *slog.Logger) (snap *snapshot.Snapshot, stop func()) {
	snap = snapshot.New(snapshot.Options{Store: st, Logger: log, ResyncInterval: s.ResyncInterval, RestoreLost: s.RestoreLostPolicies})
	initCtx, cancel := context.WithTimeout(ctx, s.StoreTimeout)
	if err := snap.Resync(initCtx); err != nil {
		log.Warn("store unreachable at start; starting unready", "store", kind, "err", err)
	}
	cancel()
	snapCtx, stopSnap := context.WithCancel(context.Background())
	snapDone := make(chan struct{})
	go func() { defer close(snapDone); snap.Run(snapCtx) }()
	return snap, func() { stopSnap(); <-snapDone }
}

// newAPI builds the REST API server the settings describe.
func newAPI(s config.Settings, st store.Store, snap *snapshot.Snapshot, reg *prometheus.Registry, log *slog.Logger,
	rlsUse func(string) (int64, time.Time, bool)) *api.Server {
	var readIdentity func(*http.Request) (string, bool)
	if mode := identityMode(s); mode != quota.IdentityBody {
		readIdentity = func(r *http.Request) (string, bool) { return quota.RequestIdentity(mode, r) }
	}
	var warnings func(*rules.Policy) []string
	if s.GRPCListen != "" {
		warnings = rlqs.Warnings // rules served to Envoy's own quota filter
	}
	return api.New(api.Options{
		Store: st, Snapshot: snap, AdminToken: s.AdminToken, ReadToken: s.ReadToken, ReadIdentity: readIdentity,
		MaxBodyBytes: s.MaxBodyBytes, MaxWait: s.MaxWait, StoreTimeout: s.StoreTimeout,
		HistoryDepth: s.HistoryDepth, MaxPolicies: s.MaxPolicies, Logger: log, Registry: reg,
		Envoys: registry.New(registry.Options{ExpireAfter: s.EnvoyExpireAfter}), StaleAfter: s.EnvoyStaleAfter,
		Warnings: warnings, RLSUse: rlsUse,
	})
}

// newTLS loads the TLS certificate files when the settings name them (nil
// otherwise) and registers the handshake and reload counters.
func newTLS(s config.Settings, reg *prometheus.Registry, log *slog.Logger) (*tlsconf.Server, error) {
	if s.TLSCertFile == "" {
		return nil, nil
	}
	tlsSrv, err := tlsconf.New(tlsconf.Files{CertFile: s.TLSCertFile, KeyFile: s.TLSKeyFile, ClientCAFile: s.ClientCAFile}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_controlplane_tls_handshakes_total",
		Help: "TLS handshakes clients started (full or resumed); Envoys keep connections alive, so this grows by a few per Envoy, not per call."},
		func() float64 { return float64(tlsSrv.Handshakes()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_controlplane_tls_reloads_total",
		Help: "Times the TLS certificate files were loaded (1 at start, then once per change on disk)."},
		func() float64 { return float64(tlsSrv.Loads()) }))
	return tlsSrv, nil
}

// newHTTPServer is the REST listener's server: the quota endpoint and the API,
// with its timeouts (writes outlive the longest long poll).
func newHTTPServer(s config.Settings, srv *api.Server, qsvc http.Handler, tlsSrv *tlsconf.Server, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/v1/quota", srv.GuardOpen(qsvc))
	mux.Handle("/", srv)
	hs := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      s.MaxWait + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if tlsSrv != nil {
		hs.TLSConfig = tlsSrv.Config()
	}
	return hs
}

// logListening says where the control plane listens and how it authenticates,
// and warns when quota calls are identified by their envoy field alone.
func logListening(s config.Settings, addr net.Addr, kind string, tls bool, log *slog.Logger) {
	auth := "bearer tokens"
	if s.AdminToken == "" && s.ReadToken == "" {
		auth = "NONE (no token configured; allowed because the listener is loopback-only)"
	}
	scheme, identity := "http", "the request's envoy field"
	if tls {
		scheme = "https"
	}
	switch {
	case s.ClientCAFile != "":
		identity = "client certificate (URI SAN, else DNS SAN)"
	case s.TrustXFCC:
		identity = "x-forwarded-client-cert header (trusted sidecar)"
	}
	log.Info("sluice-controlplane listening", "addr", addr.String(), "scheme", scheme, "store", kind, "auth", auth, "quota_identity", identity,
		"history_depth", s.HistoryDepth, "max_wait", s.MaxWait.String())
	if s.ClientCAFile == "" && !s.TrustXFCC && (s.QuotaToken != "" || s.AdminToken == "" && s.ReadToken == "") {
		log.Warn("quota calls are identified by their envoy field alone: any holder of the quota token can report, return and hold units under any Envoy id of the fleet; " +
			"this is for one trusted fleet only. Give each Envoy a certificate (--client-ca-file) or run behind a mesh sidecar (--trust-xfcc)")
	}
}

// serveGRPC listens on --grpc-listen and serves the Rate Limit Quota Service and
// the RateLimitService from qsvc (TLS as the REST listener has it), the latter's
// sweep running until ctx ends; recalls (nil for none) carry the latter's
// recalls between replicas.
func serveGRPC(ctx context.Context, s config.Settings, qsvc *quota.Service, recalls rls.Recalls, snap *snapshot.Snapshot, tlsSrv *tlsconf.Server, reg *prometheus.Registry, log *slog.Logger) (*grpc.Server, *rls.Server, error) {
	gl, err := net.Listen("tcp", s.GRPCListen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", s.GRPCListen, err)
	}
	var creds credentials.TransportCredentials
	if tlsSrv != nil {
		creds = credentials.NewTLS(tlsSrv.Config())
	}
	rs := rls.New(rls.Options{Quota: qsvc, Policies: snap, Env: s.RLSEnv, Recalls: recalls, Registry: reg, Logger: log})
	go rs.Run(ctx)
	gs := rlqs.NewGRPCServer(rlqs.New(rlqs.Options{Quota: qsvc, Registry: reg, Logger: log,
		MaxBuckets: s.RLQSMaxBuckets, MaxBucketsPerIdentity: s.RLQSMaxBucketsPerIdentity}), creds, rs.Register)
	log.Info("rate limit quota service and rate limit service (gRPC) listening", "addr", gl.Addr().String(), "scheme", map[bool]string{true: "https", false: "http"}[tlsSrv != nil])
	go func() { _ = gs.Serve(gl) }()
	return gs, rs, nil
}

// shutdown answers long polls, finishes in-flight requests, ends the RLQS
// streams and returns the RateLimitService's leases, within
// --shutdown-timeout.
func shutdown(s config.Settings, srv *api.Server, hs *http.Server, gs *grpc.Server, rs *rls.Server, log *slog.Logger) error {
	log.Info("shutting down: answering long polls, finishing in-flight requests", "timeout", s.ShutdownTimeout.String())
	srv.Drain()
	if gs != nil {
		// Streams never end by themselves: stop taking new ones, then close the rest
		// (Envoys reconnect to another replica and keep their assignments meanwhile).
		go gs.GracefulStop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("graceful shutdown: %w", err)
	}
	if rs != nil {
		// The units this replica holds go back to the keys' budgets now, not
		// when their windows end.
		n := rs.ReturnLeases(sctx)
		log.Info("rate limit service leases returned", "keys", n)
	}
	log.Info("shut down cleanly")
	return nil
}

// NewQuota builds the quota service (POST /v1/quota, and the assignments of the Rate
// Limit Quota Service) the settings select: its state in Redis (a client of its own,
// tuned to fail fast, on the --redis-url addresses) or, with the embedded store, in
// this process's memory. recalls are the RateLimitService's recalls over that
// Redis (nil with the embedded store: no other replica shares its budgets).
// close releases the client.
func NewQuota(s config.Settings, snap *snapshot.Snapshot, reg *prometheus.Registry, log *slog.Logger) (q *quota.Service, recalls rls.Recalls, close func(), err error) {
	var b quota.Backend
	close = func() {}
	if s.RedisURL != "" {
		uo, err := redisstore.Options{URL: s.RedisURL, MasterName: s.RedisMasterName}.UniversalOptions()
		if err != nil {
			return nil, nil, nil, err
		}
		quota.TuneClient(uo)
		c := redis.NewUniversalClient(uo)
		b, close = quota.NewRedis(c), func() { _ = c.Close() }
		recalls = rls.RedisRecalls{Client: c}
	} else {
		b = quota.NewMemory()
	}
	return quota.New(quota.Options{
		Backend: b, Policies: snap, Token: s.QuotaToken, Identity: identityMode(s), MaxEntriesPerIdentity: s.QuotaMaxEntriesPerIdentity,
		Open:     s.QuotaToken == "" && s.AdminToken == "" && s.ReadToken == "",
		Registry: reg, Logger: log,
	}), recalls, close, nil
}

// readBootstrap reads the --bootstrap-policy file, YAML or JSON, as JSON and
// checks it is a valid policy; the error names the file and each bad field.
func readBootstrap(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--bootstrap-policy: %w", err)
	}
	doc, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("--bootstrap-policy %s: not YAML or JSON: %w", path, err)
	}
	if _, err := api.CheckBootstrap(doc); err != nil {
		return nil, fmt.Errorf("--bootstrap-policy %s: %w", path, err)
	}
	return doc, nil
}

// bootstrap creates the bootstrap policy if the store never held it, trying
// again every interval while the store is unreachable, until done or ctx ends.
func bootstrap(ctx context.Context, srv *api.Server, doc []byte, every time.Duration, log *slog.Logger) {
	for {
		created, err := srv.Bootstrap(ctx, doc)
		switch {
		case err == nil && !created:
			log.Info("bootstrap policy: the store already has (or had) it; left as it is")
			return
		case err == nil:
			return
		}
		log.Warn("bootstrap policy: store unreachable; trying again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// identityMode is how the control plane knows who a proxy is: by its verified
// client certificate (--client-ca-file), by its sidecar's x-forwarded-client-cert
// (--trust-xfcc), or not at all (the quota calls' envoy field).
func identityMode(s config.Settings) quota.IdentityMode {
	switch {
	case s.ClientCAFile != "":
		return quota.IdentityCertificate
	case s.TrustXFCC:
		return quota.IdentityXFCC
	}
	return quota.IdentityBody
}

// serveMetrics serves /metrics, /healthz and /readyz of api over plain HTTP on
// addr (--metrics-listen), beside the main listener; the caller closes it.
func serveMetrics(addr string, api http.Handler, log *slog.Logger) (*http.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		mux.Handle(p, api)
	}
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("metrics listening", "addr", l.Addr().String(), "scheme", "http", "paths", "/metrics /healthz /readyz")
	go func() { _ = ms.Serve(l) }()
	return ms, nil
}
