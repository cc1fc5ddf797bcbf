package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/controlplane/internal/rls"
	"github.com/sluice-proxy/sluice/controlplane/internal/rlsenv"
	"github.com/sluice-proxy/sluice/controlplane/internal/rlssource"
)

// ratelimitShutdown bounds the graceful stop of the ratelimit command: calls
// in flight finished and leases returned.
const ratelimitShutdown = 10 * time.Second

// MainRateLimit runs the ratelimit command (also the image's /bin/ratelimit):
// envoyproxy/ratelimit's service, configured by its environment
// (rlsenv), deciding from sluice's fleet budgets in Redis. It serves until
// SIGINT or SIGTERM and returns the exit code: 0 ok, 1 a failure at start
// or while serving (the message names the variable when one is at fault).
func MainRateLimit(stderr io.Writer) int {
	s, err := rlsenv.Read()
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit:", err)
		return 1
	}
	lvl, _ := s.SlogLevel()
	opts := &slog.HandlerOptions{Level: slog.Level(lvl)}
	log := slog.New(slog.NewTextHandler(stderr, opts))
	if strings.EqualFold(s.LogFormat, "json") {
		log = slog.New(slog.NewJSONHandler(stderr, opts))
	}
	return untilSignal(log, "ratelimit", func(ctx context.Context) error { return RunRateLimit(ctx, s, log, nil) })
}

// RateLimitAddrs are the addresses the ratelimit command listens on.
type RateLimitAddrs struct{ HTTP, GRPC, Debug net.Addr }

// RunRateLimit serves envoyproxy/ratelimit's three listeners from s until ctx
// ends: gRPC (the RateLimitService, no caller authentication, as there:
// the network or mTLS is the boundary; grpc.health.v1 as "ratelimit"), HTTP
// (/healthcheck, /json) and debug (/rlconfig, /metrics, /debug/pprof/). The
// rules are the files of s.Dir, re-read when they change; the budgets are
// Redis's (REDIS_*), shared with every replica and every other sluice
// control plane on that Redis. listening, if not nil, gets the bound
// addresses once all three listen.
func RunRateLimit(ctx context.Context, s rlsenv.Settings, log *slog.Logger, listening func(RateLimitAddrs)) error {
	if len(s.Noted) > 0 {
		log.Info("envoyproxy/ratelimit settings read and not acted on: " + strings.Join(s.Noted, ", "))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	src, from, err := startSource(ctx, s, reg, log)
	if err != nil {
		return err
	}

	uo, err := s.RedisOptions()
	if err != nil {
		return err
	}
	quota.TuneClient(uo)
	rc := redis.NewUniversalClient(uo)
	defer rc.Close()
	qsvc := quota.New(quota.Options{Backend: quota.NewRedis(rc), Policies: src, Open: true, Identity: quota.IdentityBody,
		Registry: reg, Logger: log})
	rs := rls.New(rls.Options{Quota: qsvc, Policies: src, Recalls: rls.RedisRecalls{Client: rc}, Registry: reg, Logger: log,
		ShadowMode: s.GlobalShadowMode, QuotaMode: s.GlobalQuotaMode, DynamicMetadata: s.ResponseDynamicMetadata})
	rsCtx, stopRS := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRS()
	go rs.Run(rsCtx)

	hc := &healthCheck{src: src, needConfig: s.HealthyWithAtLeastOneConfigLoaded, grpc: health.NewServer()}
	gs, gl, err := listenGRPC(s, rs, hc, src)
	if err != nil {
		return err
	}
	defer gs.Stop()
	httpSrv, hl, err := listenHTTP(s.HTTPAddr(), rateLimitHTTP(hc, rs, src, from), log)
	if err != nil {
		return err
	}
	defer httpSrv.Close()
	debugSrv, dl, err := listenHTTP(s.DebugAddr(), rateLimitDebug(src, reg), log)
	if err != nil {
		return err
	}
	defer debugSrv.Close()
	if s.UsePrometheus {
		mux := http.NewServeMux()
		mux.Handle(s.PrometheusPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		ps, _, err := listenHTTP(s.PrometheusAddr, mux, log)
		if err != nil {
			return err
		}
		defer ps.Close()
	}
	hc.update()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				hc.update()
			}
		}
	}()
	log.Info("ratelimit serving", "grpc", gl.Addr().String(), "http", hl.Addr().String(), "debug", dl.Addr().String(),
		"tls", s.GRPCServerUseTLS, "config", from, "redis", s.RedisType)
	if listening != nil {
		listening(RateLimitAddrs{HTTP: hl.Addr(), GRPC: gl.Addr(), Debug: dl.Addr()})
	}
	<-ctx.Done()
	// As envoyproxy/ratelimit on SIGTERM: unhealthy first, then stop.
	hc.stopping.Store(true)
	hc.update()
	sctx, cancel := context.WithTimeout(context.Background(), ratelimitShutdown)
	defer cancel()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-sctx.Done():
	}
	_ = httpSrv.Shutdown(sctx)
	log.Info("rate limit service leases returned", "keys", rs.ReturnLeases(sctx))
	return nil
}

// startSource starts reading the rules where CONFIG_TYPE says: the files of
// RUNTIME_ROOT (read once before it returns), or RateLimitConfig resources
// from the xDS server at CONFIG_GRPC_XDS_SERVER_URL (waited for, as
// envoyproxy/ratelimit waits for its first configuration, unless
// FORCE_START_WITHOUT_INITIAL_CONFIG).
func startSource(ctx context.Context, s rlsenv.Settings, reg *prometheus.Registry, log *slog.Logger) (*rlssource.Served, string, error) {
	if s.ConfigType == "GRPC_XDS_SOTW" {
		tc, err := s.XDSClientTLS()
		if err != nil {
			return nil, "", err
		}
		x := rlssource.NewXDS(rlssource.XDSOptions{Server: s.XDSServerURL, NodeID: s.XDSNodeID, NodeMetadata: s.XDSNodeMetadata,
			Headers: s.XDSHeaders, TLS: tc, BackoffMin: s.XDSBackoffMin, BackoffMax: s.XDSBackoffMax, MaxRecvBytes: s.XDSMaxRecvBytes,
			MergeDomains: s.MergeDomainConfig, Registry: reg, Logger: log})
		go x.Run(ctx)
		if !s.ForceStartWithoutInitialConfig {
			log.Info("waiting for the first rate limit configuration over xDS", "server", s.XDSServerURL)
			select {
			case <-x.Received():
			case <-ctx.Done():
				return nil, "", ctx.Err()
			}
		}
		return x.Served, "xds://" + s.XDSServerURL, nil
	}
	if s.RuntimeSubdirectory == "" {
		return nil, "", errors.New("RUNTIME_SUBDIRECTORY: empty: no configuration files would be read (envoyproxy/ratelimit then serves no limits)")
	}
	dir, appOnly := s.Dir()
	fo := rlssource.FilesOptions{Dir: dir, IgnoreDotFiles: s.RuntimeIgnoreDotFiles, MergeDomains: s.MergeDomainConfig, Registry: reg, Logger: log}
	if appOnly {
		fo.AppDir = s.RuntimeAppDirectory
	}
	f := rlssource.NewFiles(fo)
	_ = f.Load() // a failure is logged and counted; the files are read again when they change
	go f.Run(ctx)
	return f.Served, dir, nil
}

// errNoConfig answers a call before any configuration has loaded (with
// FORCE_START_WITHOUT_INITIAL_CONFIG, or files that never loaded), as
// envoyproxy/ratelimit answers it (src/service/ratelimit.go,
// ShouldRateLimit: an UNKNOWN error; Envoy's ratelimit filter then applies
// its failure_mode_deny).
var errNoConfig = status.Error(codes.Unknown, "no rate limit configuration loaded")

// listenGRPC serves the RateLimitService and grpc.health.v1 on GRPC_UDS or
// GRPC_HOST:GRPC_PORT, with GRPC_SERVER_USE_TLS's credentials and
// GRPC_MAX_CONNECTION_AGE(_GRACE) as keepalive parameters.
func listenGRPC(s rlsenv.Settings, rs *rls.Server, hc *healthCheck, src *rlssource.Served) (*grpc.Server, net.Listener, error) {
	tc, err := s.GRPCServerTLS()
	if err != nil {
		return nil, nil, err
	}
	network, addr := "tcp", s.GRPCAddr()
	if s.GRPCUDS != "" {
		network, addr = "unix", s.GRPCUDS
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, nil, fmt.Errorf("GRPC_HOST/GRPC_PORT: listen on %s: %w", addr, err)
	}
	opts := []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: s.GRPCMaxConnectionAge, MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace}),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if !src.Loaded() && strings.HasPrefix(info.FullMethod, "/"+rlsv3.RateLimitService_ServiceDesc.ServiceName+"/") {
				return nil, errNoConfig
			}
			return next(ctx, req)
		}),
		// Calls run on a pool of goroutines whose stacks have already grown
		// (as the sluice-controlplane gRPC listener's do): a new goroutine per
		// call grows its stack while decoding the request, 13 % of the
		// service's CPU in a profile of one warm key, 6 % with the pool. When
		// every worker is busy a call gets a goroutine of its own.
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0)))}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gs := grpc.NewServer(opts...)
	rs.Register(gs)
	healthpb.RegisterHealthServer(gs, hc.grpc)
	go func() { _ = gs.Serve(l) }()
	return gs, l, nil
}

func listenHTTP(addr string, h http.Handler, log *slog.Logger) (*http.Server, net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(l) }()
	return srv, l, nil
}

// healthCheck is envoyproxy/ratelimit's health (src/server/health.go): healthy
// until shutdown starts, and with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
// only once a configuration with a domain has loaded; the gRPC health
// service answers the same for "ratelimit" and "".
type healthCheck struct {
	src        *rlssource.Served
	needConfig bool
	stopping   atomic.Bool
	ok         atomic.Bool
	grpc       *health.Server
}

func (h *healthCheck) update() {
	ok := !h.stopping.Load() && (!h.needConfig || h.src.Policy() != nil && len(h.src.Policy().Rules) > 0)
	h.ok.Store(ok)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", "ratelimit", rlsv3.RateLimitService_ServiceDesc.ServiceName} {
		h.grpc.SetServingStatus(name, st)
	}
}

// ServeHTTP answers /healthcheck: 200 "OK", or 500 with no body.
func (h *healthCheck) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.ok.Load() {
		_, _ = w.Write([]byte("OK"))
		return
	}
	w.WriteHeader(http.StatusInternalServerError)
}

// maxJSONBody bounds a /json request.
const maxJSONBody = 1 << 20

// rateLimitHTTP is the HTTP listener: /healthcheck, /v1/ (the rules,
// read-only: rateLimitPolicyAPI), and /json, the
// RateLimitService over HTTP/1 as envoyproxy/ratelimit serves it
// (src/server/server_impl.go, NewJsonHandler): a RateLimitRequest in
// protobuf JSON, answered 200 (OK) or 429 (OVER_LIMIT) with the response in
// protobuf JSON; 400 for a body that does not parse or a call refused.
func rateLimitHTTP(hc *healthCheck, rs *rls.Server, src *rlssource.Served, from string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthcheck", hc)
	mux.Handle("/v1/", rateLimitPolicyAPI(src, from))
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		var req rlsv3.RateLimitRequest
		if err == nil {
			err = protojson.Unmarshal(body, &req)
		}
		var resp *rlsv3.RateLimitResponse
		if err == nil && !src.Loaded() {
			err = errNoConfig
		}
		if err == nil {
			resp, err = rs.ShouldRateLimit(r.Context(), &req)
		}
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
	return mux
}

// rateLimitDebug is the debug listener: /rlconfig (the limits served, as
// envoyproxy/ratelimit prints them), /metrics, /debug/pprof/, and an index at /.
func rateLimitDebug(src *rlssource.Served, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	endpoints := map[string]string{
		"/rlconfig":            "print out the currently loaded configuration for debugging",
		"/metrics":             "Prometheus metrics",
		"/debug/pprof/":        "root of various pprof endpoints. hit for help.",
		"/debug/pprof/profile": "CPU profiling endpoint",
		"/debug/pprof/trace":   "trace endpoint",
	}
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, src.Dump()) })
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		keys := make([]string, 0, len(endpoints))
		for k := range endpoints {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s\n", k, endpoints[k])
		}
	})
	return mux
}

// rateLimitPolicyAPI serves the rules of src read-only under sluice's REST
// paths, so that sluicectl get (and any client of GET /v1/policies…) shows
// them: the list, the policy (with its ETag, "v<version>.<epoch>.<sum>" as
// the control plane's), and one rule. Every write, and every other path under
// /v1/, is refused 409 read_only, saying where the rules come from: they are
// changed there (the files, the xDS server), not over REST.
func rateLimitPolicyAPI(src *rlssource.Served, from string) http.Handler {
	fail := func(w http.ResponseWriter, status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
		_, _ = w.Write(b)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			fail(w, http.StatusConflict, "read_only", "the rules of this rate limit service come from "+from+
				" (envoyproxy/ratelimit's configuration, read as it reads it); change them there, not over the REST API")
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/policies"), "/")
		list := src.List()
		switch {
		case r.URL.Path == "/v1/policies":
			out := []map[string]any{}
			for _, rec := range list {
				out = append(out, map[string]any{"policy": rec.Name, "version": rec.Version, "rules": len(src.Policy().Rules)})
			}
			writeJSON(w, map[string]any{"policies": out})
			return
		case len(parts) < 2 || parts[0] != "" || len(list) == 0 || parts[1] != list[0].Name:
			fail(w, http.StatusNotFound, "not_found", "no such policy or endpoint: "+r.URL.Path+" (this service serves one policy, "+
				strconv.Quote("ratelimit")+", from "+from+")")
			return
		}
		rec := list[0]
		w.Header().Set("ETag", `"v`+strconv.FormatUint(rec.Version, 10)+"."+rec.Epoch+"."+rec.DocSum()+`"`)
		switch {
		case len(parts) == 2:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(rec.Doc)
		case len(parts) == 4 && parts[2] == "rules":
			var doc struct {
				Rules []json.RawMessage `json:"rules"`
			}
			_ = json.Unmarshal(rec.Doc, &doc)
			for _, raw := range doc.Rules {
				var id struct {
					ID string `json:"id"`
				}
				if json.Unmarshal(raw, &id) == nil && id.ID == parts[3] {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write(raw)
					return
				}
			}
			fail(w, http.StatusNotFound, "not_found", "policy "+rec.Name+" has no rule "+strconv.Quote(parts[3]))
		default:
			fail(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path+" (read-only: the policy and its rules)")
		}
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
