// Package config reads the control plane's settings once, from command-line
// flags and their environment-variable equivalents, into one flat Settings
// struct. Parse is a pure function of its arguments so it can be tested.
//
// Every flag --name has the environment variable SLUICE_NAME (upper case,
// '-' → '_'); a flag given on the command line wins over the environment.
//
// # Failure policy
//
// Bad configuration stops the binary from starting with an error naming the
// flag, including the safety rule: with no token configured the service
// only starts on a loopback listener.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/version"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Settings is every setting of the control plane.
type Settings struct {
	// Listen is the HTTP listen address, host:port (default 127.0.0.1:8080).
	Listen string
	// MetricsListen, when set, is a second listen address, host:port, that
	// serves only /metrics, /healthz and /readyz, always over plain HTTP (even
	// when Listen serves TLS), for a Prometheus that scrapes without the
	// control plane's client certificates; "" (default) serves none.
	MetricsListen string
	// GRPCListen is the gRPC listen address, host:port, of the Rate Limit Quota
	// Service (Envoy's rate_limit_quota filter) and gRPC health; "" (default)
	// serves none. It takes the TLS and identity settings of Listen.
	GRPCListen string
	// RLQSMaxBuckets and RLQSMaxBucketsPerIdentity bound the Rate Limit Quota
	// Service's buckets, all streams together and per identity
	// (rlqs.Options.MaxBuckets, MaxBucketsPerIdentity).
	RLQSMaxBuckets, RLQSMaxBucketsPerIdentity int
	// RLSEnv is the env the RateLimitService counts on (rls.Options.Env): the
	// Wasm filters' env, so that an HTTP descriptor rule spends their fleet keys.
	RLSEnv string
	// RedisURL selects the Redis store: a redis:// or rediss:// URL, or a
	// comma-separated list of host:port (several: Cluster, or Sentinels with
	// RedisMasterName). Empty selects the embedded store in DataDir.
	RedisURL string
	// RedisMasterName turns on Sentinel mode: the master's name.
	RedisMasterName string
	// RedisWaitReplicas, if above 0, makes every write wait until that many
	// Redis replicas acknowledged it (WAIT) before it is acknowledged.
	RedisWaitReplicas int
	// RedisWaitTimeout bounds that wait (default 1s).
	RedisWaitTimeout time.Duration
	// DataDir is the embedded store's directory (default "sluice-data").
	DataDir string
	// ResetDamagedStore makes the embedded store move a store file that is
	// not a valid store aside (sluice.db.damaged-<time>) and start with no
	// policies, instead of refusing to start (default false).
	ResetDamagedStore bool
	// RestoreLostPolicies makes the control plane write back, as a new
	// version, a policy the store lost (Redis restarted empty) that it still
	// served (snapshot.Options.RestoreLost). Default true.
	RestoreLostPolicies bool
	// MaxPolicies bounds the number of live policies; creating one more is
	// refused (default 1000).
	MaxPolicies int
	// AdminToken is the bearer token for writes (and reads).
	AdminToken string
	// ReadToken is the bearer token for reads and long polls.
	ReadToken string
	// QuotaToken is the bearer token of quota calls (POST /v1/quota), distinct
	// from the admin and read tokens. Empty: quota calls are refused, unless no
	// token at all is configured (loopback only).
	QuotaToken string
	// TLSCertFile and TLSKeyFile, both or neither, serve HTTPS on Listen (TLS 1.2
	// or later) with that PEM certificate chain and key, re-read when they change.
	TLSCertFile, TLSKeyFile string
	// ClientCAFile (needs TLS) holds the CA certificates that Envoys' client
	// certificates are verified against; then POST /v1/quota requires one instead
	// of the quota token, and an Envoy is identified by its certificate
	// (quota.IdentityCertificate).
	ClientCAFile string
	// TrustXFCC identifies Envoys by the x-forwarded-client-cert header of a mesh
	// sidecar that terminates mTLS in front of the control plane
	// (quota.IdentityXFCC). Safe only when that sidecar is the sole way in.
	TrustXFCC bool
	// RequireIdentity refuses to start unless Envoys are identified by a
	// certificate (ClientCAFile) or a trusted sidecar (TrustXFCC): never by the
	// quota calls' envoy field alone, where any holder of the quota token can act
	// for any Envoy (token-only mode). The shipped Kubernetes manifests set it.
	RequireIdentity bool
	// QuotaMaxEntriesPerIdentity bounds the ledger entries of one identity per
	// counter key (default quota.DefaultMaxEntriesPerIdentity, 16,384;
	// quota.Options.MaxEntriesPerIdentity).
	QuotaMaxEntriesPerIdentity int
	// BootstrapPolicy is a policy file (YAML or JSON, its name in "policy") the
	// control plane creates at start as version 1 if the store never held a
	// policy of that name: an empty store (a fresh cluster) starts limiting
	// without a manual apply, and nothing existing or deleted is overwritten.
	BootstrapPolicy string
	// HistoryDepth is how many versions of each policy are kept (default 50).
	HistoryDepth int
	// MaxBodyBytes bounds request bodies in bytes (default 1 MiB + 64 KiB).
	MaxBodyBytes int64
	// MaxWait bounds a long poll's ?wait= (default 60s).
	MaxWait time.Duration
	// ResyncInterval is how often versions are re-read from the store as a
	// safety net, and its health checked (default 2s).
	ResyncInterval time.Duration
	// StoreTimeout bounds each store operation of a request (default 5s).
	StoreTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown (default 15s).
	ShutdownTimeout time.Duration
	// EnvoyStaleAfter is how long after its last poll an Envoy counts as
	// STALE in GET /v1/policies/{policy}/status (default 0: --max-wait + 15s).
	EnvoyStaleAfter time.Duration
	// EnvoyExpireAfter is how long an Envoy stays in the status registry
	// after its last poll (default 10m).
	EnvoyExpireAfter time.Duration
	// LogLevel is debug, info, warn or error (default info).
	LogLevel string
	// LogFormat is json or text (default json).
	LogFormat string
}

// ErrHelp is returned by Parse for -h/--help; the usage was written to the
// output given to Parse.
var ErrHelp = flag.ErrHelp

// ErrVersion is returned by Parse for --version; the version was written to the
// output.
var ErrVersion = errors.New("config: version printed")

// Parse reads settings from args (without the program name), then from
// getenv for every flag not given, then token files through readFile.
// Usage and flag errors are written to out.
func Parse(args []string, getenv func(string) string, readFile func(string) ([]byte, error), out io.Writer) (Settings, error) {
	var s Settings
	var adminFile, readFileName, quotaFile string
	fs := flag.NewFlagSet("sluice-controlplane", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&s.Listen, "listen", "127.0.0.1:8080", "HTTP listen address host:port")
	fs.StringVar(&s.MetricsListen, "metrics-listen", "", "a second listen address host:port serving only /metrics, /healthz and /readyz over plain HTTP, even when --listen serves TLS (for Prometheus); empty: none")
	fs.StringVar(&s.GRPCListen, "grpc-listen", "", "gRPC listen address host:port of the Rate Limit Quota Service (Envoy's rate_limit_quota filter) and the RateLimitService (Envoy's ratelimit filter), same TLS and identity as --listen; empty: none")
	fs.IntVar(&s.RLQSMaxBuckets, "rlqs-max-buckets", 250000, "most Rate Limit Quota Service buckets tracked, all streams together (about 400 bytes each, whatever their ids); a further bucket is abandoned")
	fs.IntVar(&s.RLQSMaxBucketsPerIdentity, "rlqs-max-buckets-per-identity", 50000, "most Rate Limit Quota Service buckets tracked for the streams of one identity (all token callers are one)")
	fs.StringVar(&s.RLSEnv, "rls-env", "default", "the env of the counter keys the RateLimitService counts on: the Wasm filters' env, for rules with \"http\": true descriptors")
	fs.StringVar(&s.RedisURL, "redis-url", "", "Redis: redis:// or rediss:// URL, or comma-separated host:port list (Cluster, or Sentinels with --redis-master-name); empty: embedded store")
	fs.StringVar(&s.RedisMasterName, "redis-master-name", "", "Sentinel master name (the --redis-url addresses are Sentinels)")
	fs.IntVar(&s.RedisWaitReplicas, "redis-wait-replicas", 0, "acknowledge a write only once this many Redis replicas confirmed it (WAIT); 0: do not wait")
	fs.DurationVar(&s.RedisWaitTimeout, "redis-wait-timeout", time.Second, "longest wait for --redis-wait-replicas (below 2s); a write not confirmed in time answers 503")
	fs.StringVar(&s.DataDir, "data-dir", "sluice-data", "embedded store directory (used without --redis-url)")
	fs.BoolVar(&s.RestoreLostPolicies, "restore-lost-policies", true, "when the store has lost a policy this replica still serves (Redis restarted empty), write it back as a new version; false stops serving it (404) until someone re-applies it")
	fs.BoolVar(&s.ResetDamagedStore, "reset-damaged-store", false, "if the embedded store file is empty or damaged, move it aside (sluice.db.damaged-<time>) and start with NO policies; remove this flag once recovered")
	fs.IntVar(&s.MaxPolicies, "max-policies", 1000, "most live policies (1-100000); creating one more is refused with 409")
	fs.StringVar(&s.AdminToken, "admin-token", "", "admin bearer token (prefer SLUICE_ADMIN_TOKEN or --admin-token-file: flags are visible in ps)")
	fs.StringVar(&s.ReadToken, "read-token", "", "read bearer token (prefer SLUICE_READ_TOKEN or --read-token-file)")
	fs.StringVar(&s.QuotaToken, "quota-token", "", "quota bearer token for POST /v1/quota (prefer SLUICE_QUOTA_TOKEN or --quota-token-file: flags are visible in ps)")
	fs.StringVar(&adminFile, "admin-token-file", "", "file holding the admin bearer token")
	fs.StringVar(&readFileName, "read-token-file", "", "file holding the read bearer token")
	fs.StringVar(&quotaFile, "quota-token-file", "", "file holding the quota bearer token")
	fs.StringVar(&s.TLSCertFile, "tls-cert-file", "", "serve HTTPS with this PEM certificate chain (re-read when it changes); needs --tls-key-file")
	fs.StringVar(&s.TLSKeyFile, "tls-key-file", "", "the PEM private key of --tls-cert-file")
	fs.StringVar(&s.ClientCAFile, "client-ca-file", "", "PEM CA certificates verifying Envoys' client certificates: POST /v1/quota then requires one (instead of --quota-token) and identifies the Envoy by its URI SAN (SPIFFE ID), else its first DNS SAN; needs --tls-cert-file")
	fs.BoolVar(&s.RequireIdentity, "require-identity", false, "refuse to start unless Envoys are identified by a client certificate (--client-ca-file) or a mesh sidecar (--trust-xfcc): never token-only")
	fs.BoolVar(&s.TrustXFCC, "trust-xfcc", false, "identify Envoys by the x-forwarded-client-cert header of a mesh sidecar terminating mTLS (its URI=, else DNS=); ONLY safe when that sidecar is the sole way to this port")
	fs.IntVar(&s.QuotaMaxEntriesPerIdentity, "quota-max-entries-per-identity", 16384, "most ledger entries (Envoy ids) one certificate identity holds per counter key, about 100 bytes of Redis memory each; a further id is answered retry until an entry that can give way is forgotten (1-262144)")
	fs.StringVar(&s.BootstrapPolicy, "bootstrap-policy", "", "policy file (YAML or JSON) created at start if the store never held a policy of its name; never overwrites or re-creates a deleted one")
	fs.IntVar(&s.HistoryDepth, "history-depth", 50, "versions kept per policy (1-10000)")
	fs.Int64Var(&s.MaxBodyBytes, "max-body-bytes", 1<<20+64<<10, "largest request body in bytes")
	fs.DurationVar(&s.MaxWait, "max-wait", 60*time.Second, "longest long-poll wait")
	fs.DurationVar(&s.ResyncInterval, "resync-interval", 2*time.Second, "interval of the store version re-read and health check")
	fs.DurationVar(&s.StoreTimeout, "store-timeout", 5*time.Second, "timeout of each store operation")
	fs.DurationVar(&s.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "graceful shutdown limit")
	fs.DurationVar(&s.EnvoyStaleAfter, "envoy-stale-after", 0, "an Envoy not polling for longer counts as STALE in policy status; 0: --max-wait + 15s")
	fs.DurationVar(&s.EnvoyExpireAfter, "envoy-expire-after", 10*time.Minute, "an Envoy not polling for longer is dropped from policy status")
	fs.StringVar(&s.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&s.LogFormat, "log-format", "json", "log format: json or text")
	showVersion := fs.Bool("version", false, "print the version and exit (no environment variable)")
	if err := fs.Parse(args); err != nil {
		return Settings{}, err
	}
	if *showVersion {
		fmt.Fprintln(out, "sluice-controlplane", version.String())
		return Settings{}, ErrVersion
	}
	if fs.NArg() > 0 {
		return Settings{}, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || f.Name == "version" {
			return
		}
		env := EnvName(f.Name)
		if v := getenv(env); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("config: %s=%q: %v", env, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return Settings{}, err
	}
	for _, t := range []struct {
		token *string
		file  string
		flag  string
	}{{&s.AdminToken, adminFile, "admin-token"}, {&s.ReadToken, readFileName, "read-token"}, {&s.QuotaToken, quotaFile, "quota-token"}} {
		if t.file == "" {
			continue
		}
		if *t.token != "" {
			return Settings{}, fmt.Errorf("config: both --%s (or %s) and --%s-file given; use one", t.flag, EnvName(t.flag), t.flag)
		}
		b, err := readFile(t.file)
		if err != nil {
			return Settings{}, fmt.Errorf("config: --%s-file: %w", t.flag, err)
		}
		*t.token = strings.TrimSpace(string(b))
		if *t.token == "" {
			return Settings{}, fmt.Errorf("config: --%s-file %s is empty", t.flag, t.file)
		}
	}
	return s, s.Check()
}

// EnvName is the environment variable of a flag: SLUICE_ + upper case, '-' → '_'.
func EnvName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ErrNoTokens is returned by Check when no token is configured and the
// listener is not loopback-only.
var ErrNoTokens = errors.New("config: no admin or read token configured (SLUICE_ADMIN_TOKEN, SLUICE_READ_TOKEN or --admin-token-file/--read-token-file); refusing to serve an unauthenticated API on a non-loopback address")

// Check validates the settings.
func (s Settings) Check() error {
	if err := s.checkListeners(); err != nil {
		return err
	}
	if err := s.checkValues(); err != nil {
		return err
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config: --log-level %q: want debug, info, warn or error", s.LogLevel)
	}
	switch s.LogFormat {
	case "json", "text":
	default:
		return fmt.Errorf("config: --log-format %q: want json or text", s.LogFormat)
	}
	return nil
}

// checkListeners checks the listen addresses and the tokens they need.
func (s Settings) checkListeners() error {
	host, port, err := net.SplitHostPort(s.Listen)
	if err != nil {
		return fmt.Errorf("config: --listen %q: want host:port: %v", s.Listen, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("config: --listen %q: bad port", s.Listen)
	}
	if s.AdminToken == "" && s.ReadToken == "" && !Loopback(host) {
		return ErrNoTokens
	}
	if s.TrustXFCC && s.QuotaToken == "" {
		for _, addr := range []string{s.Listen, s.GRPCListen} {
			if h, _, err := net.SplitHostPort(addr); err == nil && !Loopback(h) {
				return fmt.Errorf("config: --trust-xfcc without --quota-token on the non-loopback listener %s: anyone who reaches it directly can write x-forwarded-client-cert and pose as any Envoy; set --quota-token (SLUICE_QUOTA_TOKEN), or listen on loopback behind the sidecar", addr)
			}
		}
	}
	if s.MetricsListen != "" {
		if _, mport, err := net.SplitHostPort(s.MetricsListen); err != nil {
			return fmt.Errorf("config: --metrics-listen %q: want host:port: %v", s.MetricsListen, err)
		} else if _, err := strconv.ParseUint(mport, 10, 16); err != nil {
			return fmt.Errorf("config: --metrics-listen %q: bad port", s.MetricsListen)
		}
	}
	if s.GRPCListen != "" {
		ghost, gport, err := net.SplitHostPort(s.GRPCListen)
		if err != nil {
			return fmt.Errorf("config: --grpc-listen %q: want host:port: %v", s.GRPCListen, err)
		}
		if _, err := strconv.ParseUint(gport, 10, 16); err != nil {
			return fmt.Errorf("config: --grpc-listen %q: bad port", s.GRPCListen)
		}
		if s.QuotaToken == "" && s.ClientCAFile == "" && !Loopback(ghost) {
			return errors.New("config: --grpc-listen on a non-loopback address needs --quota-token or --client-ca-file: the Rate Limit Quota Service would spend fleet budgets for anyone")
		}
	}
	if s.QuotaToken != "" && (s.QuotaToken == s.AdminToken || s.QuotaToken == s.ReadToken) {
		return errors.New("config: the quota token must differ from the admin and read tokens")
	}
	if s.AdminToken != "" && s.AdminToken == s.ReadToken {
		return errors.New("config: the admin and read tokens must differ")
	}
	return nil
}

// checkValues checks TLS, identity, bounds and the store flags.
func (s Settings) checkValues() error {
	switch {
	case (s.TLSCertFile == "") != (s.TLSKeyFile == ""):
		return errors.New("config: --tls-cert-file and --tls-key-file go together: give both or neither")
	case s.ClientCAFile != "" && s.TLSCertFile == "":
		return errors.New("config: --client-ca-file needs --tls-cert-file and --tls-key-file (client certificates are only seen over TLS)")
	case s.ClientCAFile != "" && s.TrustXFCC:
		return errors.New("config: --client-ca-file and --trust-xfcc both name where Envoy identities come from; use one")
	case s.RequireIdentity && s.ClientCAFile == "" && !s.TrustXFCC:
		return errors.New("config: --require-identity: no way to know which Envoy calls (token-only: any holder of the quota token could act for any Envoy); " +
			"serve mTLS with --client-ca-file (envoy/kubernetes/controlplane-mtls.yaml), or, behind a mesh sidecar that is the only way in, set --trust-xfcc (Istio: trust-xfcc \"true\" in the ConfigMap)")
	case !rules.ValidName(s.RLSEnv):
		return fmt.Errorf("config: --rls-env %q: want 1 to 63 characters of a-z, 0-9, '_', '.', '-'", s.RLSEnv)
	case s.RLQSMaxBuckets < 1 || s.RLQSMaxBucketsPerIdentity < 1:
		return fmt.Errorf("config: --rlqs-max-buckets %d and --rlqs-max-buckets-per-identity %d: want ≥ 1", s.RLQSMaxBuckets, s.RLQSMaxBucketsPerIdentity)
	case s.QuotaMaxEntriesPerIdentity < 1 || s.QuotaMaxEntriesPerIdentity > 262144:
		return fmt.Errorf("config: --quota-max-entries-per-identity %d: want 1 to 262144", s.QuotaMaxEntriesPerIdentity)
	case s.HistoryDepth < 1 || s.HistoryDepth > 10000:
		return fmt.Errorf("config: --history-depth %d: want 1 to 10000", s.HistoryDepth)
	case s.MaxBodyBytes < 1024:
		return fmt.Errorf("config: --max-body-bytes %d: want ≥ 1024", s.MaxBodyBytes)
	case s.EnvoyStaleAfter < 0:
		return fmt.Errorf("config: --envoy-stale-after %s: want ≥ 0", s.EnvoyStaleAfter)
	case s.EnvoyExpireAfter < time.Second:
		return fmt.Errorf("config: --envoy-expire-after %s: want ≥ 1s", s.EnvoyExpireAfter)
	case s.MaxWait < time.Second:
		return fmt.Errorf("config: --max-wait %s: want ≥ 1s", s.MaxWait)
	case s.ResyncInterval < 10*time.Millisecond:
		return fmt.Errorf("config: --resync-interval %s: want ≥ 10ms", s.ResyncInterval)
	case s.StoreTimeout <= 0:
		return fmt.Errorf("config: --store-timeout %s: want > 0", s.StoreTimeout)
	case s.ShutdownTimeout <= 0:
		return fmt.Errorf("config: --shutdown-timeout %s: want > 0", s.ShutdownTimeout)
	case s.RedisURL == "" && s.DataDir == "":
		return errors.New("config: neither --redis-url nor --data-dir given")
	case s.MaxPolicies < 1 || s.MaxPolicies > 100000:
		return fmt.Errorf("config: --max-policies %d: want 1 to 100000", s.MaxPolicies)
	case s.ResetDamagedStore && s.RedisURL != "":
		return errors.New("config: --reset-damaged-store applies to the embedded store only, not with --redis-url")
	case s.RedisWaitReplicas < 0:
		return fmt.Errorf("config: --redis-wait-replicas %d: want ≥ 0", s.RedisWaitReplicas)
	case s.RedisWaitReplicas > 0 && s.RedisURL == "":
		return errors.New("config: --redis-wait-replicas needs --redis-url")
	case s.RedisWaitReplicas > 0 && (s.RedisWaitTimeout < time.Millisecond || s.RedisWaitTimeout >= 2*time.Second):
		return fmt.Errorf("config: --redis-wait-timeout %s: want 1ms to below 2s", s.RedisWaitTimeout)
	case s.RedisMasterName != "" && s.RedisURL == "":
		return errors.New("config: --redis-master-name needs --redis-url (the Sentinel addresses)")
	}
	return nil
}

// Loopback reports whether host (from host:port) only reaches this machine:
// "localhost" or a loopback IP. An empty host (all interfaces) is not.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
