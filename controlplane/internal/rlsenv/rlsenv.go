// Package rlsenv reads envoyproxy/ratelimit's environment, so that a Deployment
// written for envoyproxy/ratelimit runs sluice's RateLimitService with only its
// image changed. The variables, their defaults and their parsing are
// envoyproxy/ratelimit's (src/settings/settings.go, read with
// github.com/kelseyhightower/envconfig as there). Each variable is one of:
//
//   - served: it means here what it means there (Served lists them);
//   - noted: it only tunes metrics, tracing or Redis connections sluice does not
//     need; Read returns it in Settings.Noted, and the caller logs them in one line;
//   - refused: it would change answers or where rules come from in a way not
//     served here; Read fails, naming it.
package rlsenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/redis/go-redis/v9"
)

// Settings are the variables read, with envoyproxy/ratelimit's names and
// defaults. Durations are Go durations ("10s"), as there.
type Settings struct {
	// HTTP listener: /healthcheck and /json.
	Host string `envconfig:"HOST" default:"0.0.0.0"`
	Port int    `envconfig:"PORT" default:"8080"`
	// Debug listener: /rlconfig, /metrics, /debug/pprof/.
	DebugHost string `envconfig:"DEBUG_HOST" default:"0.0.0.0"`
	DebugPort int    `envconfig:"DEBUG_PORT" default:"6070"`
	// gRPC listener: the RateLimitService and grpc.health.v1 ("ratelimit").
	// GRPCUDS, when set, is a Unix socket path listened on instead.
	GRPCUDS                   string        `envconfig:"GRPC_UDS"`
	GRPCHost                  string        `envconfig:"GRPC_HOST" default:"0.0.0.0"`
	GRPCPort                  int           `envconfig:"GRPC_PORT" default:"8081"`
	GRPCMaxConnectionAge      time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE" default:"24h"`
	GRPCMaxConnectionAgeGrace time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE_GRACE" default:"1h"`
	// gRPC TLS: a server certificate, and with a client CA, client
	// certificates required (mTLS), their SAN checked when GRPCClientTLSSAN is set.
	GRPCServerUseTLS    bool   `envconfig:"GRPC_SERVER_USE_TLS"`
	GRPCServerTLSCert   string `envconfig:"GRPC_SERVER_TLS_CERT"`
	GRPCServerTLSKey    string `envconfig:"GRPC_SERVER_TLS_KEY"`
	GRPCClientTLSCACert string `envconfig:"GRPC_CLIENT_TLS_CACERT"`
	GRPCClientTLSSAN    string `envconfig:"GRPC_CLIENT_TLS_SAN"`

	// LogLevel is one of logrus's levels (trace, debug, info, warn, warning,
	// error, fatal, panic), any case; LogFormat text or json.
	LogLevel  string `envconfig:"LOG_LEVEL" default:"WARN"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`

	// Where rules come from: FILE, the files under
	// RuntimeRoot/RuntimeSubdirectory/RuntimeAppDirectory (see Dir), or
	// GRPC_XDS_SOTW, RateLimitConfig resources from an xDS server.
	ConfigType                     string `envconfig:"CONFIG_TYPE" default:"FILE"`
	ForceStartWithoutInitialConfig bool   `envconfig:"FORCE_START_WITHOUT_INITIAL_CONFIG"`
	RuntimeRoot                    string `envconfig:"RUNTIME_ROOT" default:"/srv/runtime_data/current"`
	RuntimeSubdirectory            string `envconfig:"RUNTIME_SUBDIRECTORY"`
	RuntimeAppDirectory            string `envconfig:"RUNTIME_APPDIRECTORY" default:"config"`
	RuntimeIgnoreDotFiles          bool   `envconfig:"RUNTIME_IGNOREDOTFILES"`
	RuntimeWatchRoot               bool   `envconfig:"RUNTIME_WATCH_ROOT" default:"true"`
	MergeDomainConfig              bool   `envconfig:"MERGE_DOMAIN_CONFIG"`
	// The xDS server (GRPC_XDS_SOTW): its address, the node sent, extra
	// stream metadata ("k:v,k:v"), TLS to it, the reconnect backoff, and the
	// largest response.
	XDSServerURL                      string            `envconfig:"CONFIG_GRPC_XDS_SERVER_URL" default:"localhost:18000"`
	XDSNodeID                         string            `envconfig:"CONFIG_GRPC_XDS_NODE_ID" default:"default"`
	XDSNodeMetadata                   string            `envconfig:"CONFIG_GRPC_XDS_NODE_METADATA"`
	XDSHeaders                        map[string]string `envconfig:"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"`
	XDSServerUseTLS                   bool              `envconfig:"CONFIG_GRPC_XDS_SERVER_USE_TLS"`
	XDSClientTLSCert                  string            `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"`
	XDSClientTLSKey                   string            `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"`
	XDSServerTLSCACert                string            `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_CACERT"`
	XDSServerTLSSAN                   string            `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_SAN"`
	XDSBackoffMin                     time.Duration     `envconfig:"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL" default:"10s"`
	XDSBackoffMax                     time.Duration     `envconfig:"XDS_CLIENT_BACKOFF_MAX_INTERVAL" default:"60s"`
	XDSMaxRecvBytes                   int               `envconfig:"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"`
	HealthyWithAtLeastOneConfigLoaded bool              `envconfig:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"`

	// Redis, where the fleet budgets are kept.
	BackendType                      string        `envconfig:"BACKEND_TYPE" default:"redis"`
	RedisSocketType                  string        `envconfig:"REDIS_SOCKET_TYPE" default:"unix"`
	RedisType                        string        `envconfig:"REDIS_TYPE" default:"SINGLE"`
	RedisURL                         string        `envconfig:"REDIS_URL" default:"/var/run/nutcracker/ratelimit.sock"`
	RedisPoolSize                    int           `envconfig:"REDIS_POOL_SIZE" default:"10"`
	RedisAuth                        string        `envconfig:"REDIS_AUTH"`
	RedisSentinelAuth                string        `envconfig:"REDIS_SENTINEL_AUTH"`
	RedisTLS                         bool          `envconfig:"REDIS_TLS"`
	RedisTLSClientCert               string        `envconfig:"REDIS_TLS_CLIENT_CERT"`
	RedisTLSClientKey                string        `envconfig:"REDIS_TLS_CLIENT_KEY"`
	RedisTLSCACert                   string        `envconfig:"REDIS_TLS_CACERT"`
	RedisTLSSkipHostnameVerification bool          `envconfig:"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"`
	RedisTimeout                     time.Duration `envconfig:"REDIS_TIMEOUT" default:"10s"`
	RedisPoolOnEmptyBehavior         string        `envconfig:"REDIS_POOL_ON_EMPTY_BEHAVIOR" default:"WAIT"`

	// UsePrometheus serves the metrics on PrometheusAddr at PrometheusPath
	// too (they are always on the debug listener's /metrics).
	UsePrometheus  bool   `envconfig:"USE_PROMETHEUS"`
	PrometheusAddr string `envconfig:"PROMETHEUS_ADDR" default:":9090"`
	PrometheusPath string `envconfig:"PROMETHEUS_PATH" default:"/metrics"`

	// GlobalShadowMode answers every call OK overall, GlobalQuotaMode
	// decides every limit in quota mode, ResponseDynamicMetadata writes the
	// call into the response's dynamic metadata, as upstream's service does
	// (src/service/ratelimit.go; rls.Options).
	GlobalShadowMode        bool `envconfig:"SHADOW_MODE"`
	GlobalQuotaMode         bool `envconfig:"QUOTA_MODE"`
	ResponseDynamicMetadata bool `envconfig:"RESPONSE_DYNAMIC_METADATA"`

	// Read only to be refused: they would change answers.
	RedisPerSecond         bool `envconfig:"REDIS_PERSECOND"`
	ResponseHeadersEnabled bool `envconfig:"LIMIT_RESPONSE_HEADERS_ENABLED"`

	// Noted lists the variables set that are read and not acted on, each
	// "NAME (why)", sorted.
	Noted []string `ignored:"true"`
}

// notedVars are the variables that only tune what sluice has no use for,
// with why; prefixes end in "_" and cover every variable that starts with them.
var notedVars = []struct{ name, why string }{
	{"USE_STATSD", "metrics: sluice serves Prometheus metrics on the debug listener's /metrics"},
	{"STATSD_", "metrics"}, {"USE_DOG_STATSD", "metrics"}, {"USE_DOG_STATSD_MOGRIFIERS", "metrics"},
	{"EXTRA_TAGS", "metrics"}, {"STATS_FLUSH_INTERVAL", "metrics"}, {"DISABLE_STATS", "metrics"},
	{"PROMETHEUS_MAPPER_YAML", "metrics: sluice's series have their own names"},
	{"NEAR_LIMIT_RATIO", "metrics: the near-limit counter"},
	{"TRACING_", "tracing is not exported"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "sluice decides from leases, without a Redis call per decision"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "Redis key expiry"},
	{"CACHE_KEY_PREFIX", "Redis keys: sluice's counter keys are its own"},
	{"REDIS_PIPELINE_WINDOW", "Redis batching"}, {"REDIS_PIPELINE_LIMIT", "Redis batching"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "sluice starts unready and recovers when Redis is away"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "Redis pool"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "sluice never counts refused hits, as this variable set to true does"},
	{"MEMCACHE_", "unused: BACKEND_TYPE is redis"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "the stream reconnects with XDS_CLIENT_BACKOFF_* alone"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "the backoff doubles, jittered by half"}, {"XDS_CLIENT_BACKOFF_JITTER", "the backoff is always jittered"},
	{"REDIS_PERSECOND_", "unused: REDIS_PERSECOND is false"},
}

// Served lists the variables read and acted on as envoyproxy/ratelimit does.
var Served = []string{
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT",
	"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL", "LOG_FORMAT",
	"CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY",
	"RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT", "MERGE_DOMAIN_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	"BACKEND_TYPE", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_SENTINEL_AUTH",
	"REDIS_TLS", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_TIMEOUT", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH",
}

// Read reads the process environment into Settings. Errors: a value that does not parse (envconfig's message
// names the variable), or a variable that would change answers in a way not
// served (the error names it and says why).
func Read() (Settings, error) {
	var s Settings
	if err := envconfig.Process("", &s); err != nil {
		return s, err
	}
	if err := s.check(); err != nil {
		return s, err
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if why, ok := noted(name); ok {
			s.Noted = append(s.Noted, name+" ("+why+")")
		}
	}
	slices.Sort(s.Noted)
	return s, nil
}

// noted reports whether name is a noted variable and why.
func noted(name string) (string, bool) {
	for _, v := range notedVars {
		if v.name == name || strings.HasSuffix(v.name, "_") && strings.HasPrefix(name, v.name) {
			return v.why, true
		}
	}
	return "", false
}

// check refuses what would change answers and is not served, naming the variable.
func (s *Settings) check() error {
	refuse := func(name, why string) error { return fmt.Errorf("%s: %s", name, why) }
	switch {
	case s.ConfigType != "FILE" && s.ConfigType != "GRPC_XDS_SOTW":
		return refuse("CONFIG_TYPE", fmt.Sprintf("%q: want FILE or GRPC_XDS_SOTW", s.ConfigType))
	case !strings.EqualFold(s.BackendType, "redis"):
		return refuse("BACKEND_TYPE", fmt.Sprintf("%q: sluice keeps its budgets in Redis only; want redis", s.BackendType))
	case s.RedisPerSecond:
		return refuse("REDIS_PERSECOND", "a second Redis for per-second limits is not served; unset it (sluice makes almost no Redis calls per decision)")
	case s.ResponseHeadersEnabled:
		return refuse("LIMIT_RESPONSE_HEADERS_ENABLED", "response headers from the service are not served; use the ratelimit filter's enable_x_ratelimit_headers")
	}
	switch strings.ToLower(s.RedisType) {
	case "single", "cluster", "sentinel":
	default:
		return refuse("REDIS_TYPE", fmt.Sprintf("%q: want SINGLE, SENTINEL or CLUSTER", s.RedisType))
	}
	switch strings.ToLower(s.RedisSocketType) {
	case "tcp", "unix":
	default:
		return refuse("REDIS_SOCKET_TYPE", fmt.Sprintf("%q: want tcp or unix", s.RedisSocketType))
	}
	if b := strings.ToUpper(s.RedisPoolOnEmptyBehavior); b == "CREATE" || b == "ERROR" {
		// envoyproxy/ratelimit refuses these too (src/redis/driver_impl.go).
		return refuse("REDIS_POOL_ON_EMPTY_BEHAVIOR", b+" is not supported; remove it or set WAIT")
	}
	if s.GRPCServerUseTLS && (s.GRPCServerTLSCert == "" || s.GRPCServerTLSKey == "") {
		return refuse("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	if !strings.EqualFold(s.LogFormat, "text") && !strings.EqualFold(s.LogFormat, "json") {
		// envoyproxy/ratelimit takes anything but json as text.
		s.LogFormat = "text"
	}
	if _, err := s.SlogLevel(); err != nil {
		return refuse("LOG_LEVEL", err.Error())
	}
	return nil
}

// Dir returns the directory whose files are the rules, and whether only the
// files under its RuntimeAppDirectory are read, as goruntime's loader reads
// them there (src/provider/file_provider.go): with RUNTIME_WATCH_ROOT, every
// file under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY whose path starts with
// RUNTIME_APPDIRECTORY/; without, every file under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (s Settings) Dir() (dir string, appOnly bool) {
	if s.RuntimeWatchRoot {
		return joinPath(s.RuntimeRoot, s.RuntimeSubdirectory), true
	}
	return joinPath(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory), false
}

func joinPath(parts ...string) string {
	var b []string
	for _, p := range parts {
		if p != "" {
			b = append(b, strings.TrimRight(p, "/"))
		}
	}
	return strings.Join(b, "/")
}

// SlogLevel maps LOG_LEVEL, one of logrus's levels, to slog's: trace and
// debug to Debug, info to Info, warn and warning to Warn, error, fatal and
// panic to Error. Error: any other value.
func (s Settings) SlogLevel() (int, error) {
	switch strings.ToLower(s.LogLevel) {
	case "trace", "debug":
		return -4, nil
	case "info":
		return 0, nil
	case "warn", "warning":
		return 4, nil
	case "error", "fatal", "panic":
		return 8, nil
	}
	return 0, fmt.Errorf("%q: want trace, debug, info, warn, error, fatal or panic", s.LogLevel)
}

// HTTPAddr, GRPCAddr and DebugAddr are the listeners' host:port.
func (s Settings) HTTPAddr() string  { return net.JoinHostPort(s.Host, fmt.Sprint(s.Port)) }
func (s Settings) GRPCAddr() string  { return net.JoinHostPort(s.GRPCHost, fmt.Sprint(s.GRPCPort)) }
func (s Settings) DebugAddr() string { return net.JoinHostPort(s.DebugHost, fmt.Sprint(s.DebugPort)) }

// RedisOptions returns the go-redis options of REDIS_*, as
// envoyproxy/ratelimit's client reads them (src/redis/driver_impl.go):
// REDIS_URL is host:port (or a socket path with REDIS_SOCKET_TYPE=unix) for
// SINGLE, comma-separated host:port for CLUSTER, and the master name followed
// by the sentinels' host:port for SENTINEL; REDIS_AUTH and
// REDIS_SENTINEL_AUTH are a password or user:password. Errors: a sentinel URL
// without sentinels, or TLS files that do not load.
func (s Settings) RedisOptions() (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{PoolSize: s.RedisPoolSize}
	urls := strings.Split(s.RedisURL, ",")
	switch strings.ToLower(s.RedisType) {
	case "single":
		o.Addrs = []string{s.RedisURL}
	case "cluster":
		o.Addrs, o.IsClusterMode = urls, true
	case "sentinel":
		if len(urls) < 2 {
			return nil, errors.New("REDIS_URL: want <master name>,<sentinel host:port>,... for REDIS_TYPE=SENTINEL")
		}
		o.MasterName, o.Addrs = urls[0], urls[1:]
		o.SentinelUsername, o.SentinelPassword = splitAuth(s.RedisSentinelAuth)
	}
	o.Username, o.Password = splitAuth(s.RedisAuth)
	if strings.EqualFold(s.RedisSocketType, "unix") {
		o.Dialer = func(ctx context.Context, _, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}
	}
	if s.RedisTLS {
		c, err := tlsFiles(s.RedisTLSClientCert, s.RedisTLSClientKey, s.RedisTLSCACert)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS: %w", err)
		}
		c.InsecureSkipVerify = s.RedisTLSSkipHostnameVerification
		o.TLSConfig = c
	}
	return o, nil
}

// splitAuth splits "user:password" or "password".
func splitAuth(a string) (user, pass string) {
	if u, p, ok := strings.Cut(a, ":"); ok {
		return u, p
	}
	return "", a
}

// GRPCServerTLS returns the gRPC listener's TLS configuration, nil without
// GRPC_SERVER_USE_TLS: the server certificate, and with
// GRPC_CLIENT_TLS_CACERT a client certificate from that CA required, its DNS
// SAN checked against GRPC_CLIENT_TLS_SAN when set (src/server/tls.go).
// Errors: files that do not load.
func (s Settings) GRPCServerTLS() (*tls.Config, error) {
	if !s.GRPCServerUseTLS {
		return nil, nil
	}
	c, err := tlsFiles(s.GRPCServerTLSCert, s.GRPCServerTLSKey, "")
	if err != nil {
		return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT: %w", err)
	}
	c.MinVersion = tls.VersionTLS12
	if s.GRPCClientTLSCACert == "" {
		return c, nil
	}
	pool, err := readPool(s.GRPCClientTLSCACert)
	if err != nil {
		return nil, fmt.Errorf("GRPC_CLIENT_TLS_CACERT: %w", err)
	}
	c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	if san := s.GRPCClientTLSSAN; san != "" {
		c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			for _, chain := range chains {
				if err := chain[0].VerifyHostname(san); err != nil {
					return fmt.Errorf("client certificate: %w", err)
				}
			}
			return nil
		}
	}
	return c, nil
}

// XDSClientTLS returns the TLS configuration of the stream to the xDS
// server, nil without CONFIG_GRPC_XDS_SERVER_USE_TLS: the client
// certificate, the server's CA, and CONFIG_GRPC_XDS_SERVER_TLS_SAN as the
// name checked in the server's certificate when set (otherwise the
// server address's host), as envoyproxy/ratelimit sets it up. Errors:
// files that do not load.
func (s Settings) XDSClientTLS() (*tls.Config, error) {
	if !s.XDSServerUseTLS {
		return nil, nil
	}
	c, err := tlsFiles(s.XDSClientTLSCert, s.XDSClientTLSKey, s.XDSServerTLSCACert)
	if err != nil {
		return nil, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT: %w", err)
	}
	c.MinVersion = tls.VersionTLS12
	c.ServerName = s.XDSServerTLSSAN
	return c, nil
}

// tlsFiles loads a key pair (when both files are given) and a CA pool (when
// caFile is given) as the root CAs.
func tlsFiles(certFile, keyFile, caFile string) (*tls.Config, error) {
	c := &tls.Config{}
	if certFile != "" && keyFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{kp}
	}
	if caFile != "" {
		pool, err := readPool(caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}

func readPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return pool, nil
}
