// Package api is the control plane's REST API (JSON over HTTP/1.1), as
// described by controlplane/openapi.yaml: policies and their rules, version
// history and rollback, long-poll reads for the filter, health, readiness and
// Prometheus metrics.
//
// # Conditional requests (RFC 9110)
//
// A policy's entity tag names its version, its store epoch and its content:
// ETag "v7.3f9c0e7a2b4d6c80.5d41402abc4b2a76" (strong, quoted; see etag). Reads
// honour If-None-Match (304 Not Modified, §13.1.2); every write honours
// If-Match (412 Precondition Failed on a stale tag or "*" on a missing
// policy, §13.1.1), and PUT of a whole policy also If-None-Match: * (create
// only). GET with ?wait=<duration> is a long poll: it holds the request until
// the answer differs from what If-None-Match says the client has (a new
// version, a deletion, or for an unknown policy its creation) or the wait
// ends, and then answers as a plain conditional GET would (304 or 404).
//
// # Authentication (RFC 6750)
//
// Clients send Authorization: Bearer <token>. Writes need the admin token;
// reads and watches accept the read or the admin token. A missing token is
// 401 with WWW-Authenticate: Bearer; a wrong token, or the read token on a
// write, is 403. Tokens are compared in constant time and never logged.
//
// With no token configured every request is allowed (the binary only
// permits this on a loopback listener), with two checks against a web page
// in the operator's browser reaching that listener: a Host that is not a
// loopback name or address (localhost, 127.0.0.0/8, [::1], any port) is 403
// forbidden_host, since a DNS-rebinding page sends its own host name
// (https://en.wikipedia.org/wiki/DNS_rebinding); and a write whose Origin
// (RFC 6454) is not this server's own is 403 forbidden_origin.
//
// # Failure policy
//
// Nothing a client sends yields a 500: bad input is 4xx with a JSON error.
// When the store is unreachable reads are served from the in-memory snapshot
// and writes answer 503; a write is acknowledged only after the store
// confirmed it.
package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/httpjson"
	"github.com/sluice-proxy/sluice/controlplane/internal/registry"
	"github.com/sluice-proxy/sluice/controlplane/internal/snapshot"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Options configure New.
type Options struct {
	// Store is where writes go and history is read from.
	Store store.Store
	// Snapshot is the in-memory view reads are served from; its Run must be
	// running for changes made elsewhere to be seen.
	Snapshot *snapshot.Snapshot
	// AdminToken and ReadToken are the bearer tokens; both empty disables
	// authentication.
	AdminToken, ReadToken string
	// ReadIdentity, if set, lets a request that sends no Authorization header
	// read (what the read token allows) when it returns true: the control plane
	// can tell who the caller is without a token (a verified client certificate,
	// a trusted sidecar's x-forwarded-client-cert; quota.RequestIdentity). Writes
	// always need the admin token.
	ReadIdentity func(r *http.Request) (identity string, ok bool)
	// MaxBodyBytes bounds request bodies (413 beyond); 0 means 1 MiB + 64 KiB.
	MaxBodyBytes int64
	// MaxWait bounds ?wait= of long polls; 0 means 60 seconds.
	MaxWait time.Duration
	// StoreTimeout bounds each store call made for a request; 0 means 5s.
	StoreTimeout time.Duration
	// HistoryDepth is the configured history depth, used in messages.
	HistoryDepth int
	// MaxPolicies bounds the number of live policies: creating one more is
	// 409 too_many_policies; 0 means 1000.
	MaxPolicies int
	// Logger receives request errors; nil means slog.Default().
	Logger *slog.Logger
	// Registry receives the metrics; nil means a new registry.
	Registry *prometheus.Registry
	// Now is the clock for history timestamps; nil means time.Now.
	Now func() time.Time
	// Envoys, if set, records the Envoys whose long polls identify them
	// (x-sluice-node) and answers GET /v1/policies/{policy}/status.
	Envoys *registry.Registry
	// RLSUse, when set, says how many descriptors this replica's
	// RateLimitService has decided under a policy's rules and when it last
	// did (rls.Server.Use); GET /v1/policies/{policy}/status shows it.
	RLSUse func(policy string) (decisions int64, last time.Time, ok bool)
	// StaleAfter is how long after it was last seen an Envoy that is not
	// polling counts as STALE; 0 means MaxWait + DefaultStaleMargin.
	StaleAfter time.Duration
	// Warnings, when set, names what in a valid policy about to be written will
	// work poorly (one sentence each). A write answers each as a Warning header
	// (warn-code 299, RFC 7234 section 5.5, as the Kubernetes API does), and
	// still writes.
	Warnings func(p *rules.Policy) []string
}

// DefaultStaleMargin is added to MaxWait for the default StaleAfter: an
// Envoy reconnects within its poll timeout (wait plus at most 10%) after
// a poll ends, so one that has not polled for longer is gone or cut off.
const DefaultStaleMargin = 15 * time.Second

// Server is the API's http.Handler.
type Server struct {
	o       Options
	mux     *http.ServeMux
	log     *slog.Logger
	metrics *metrics
	// lastBadToken is when a refused token was last logged, Unix ns.
	lastBadToken atomic.Int64

	adminSum, readSum [32]byte
	authOn            bool

	drainOnce sync.Once
	draining  chan struct{}
}

// New builds the server and registers its metrics.
func New(o Options) *Server {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1<<20 + 64<<10
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 60 * time.Second
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = 5 * time.Second
	}
	if o.MaxPolicies <= 0 {
		o.MaxPolicies = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = o.MaxWait + DefaultStaleMargin
	}
	s := &Server{o: o, mux: http.NewServeMux(), log: o.Logger, draining: make(chan struct{})}
	s.authOn = o.AdminToken != "" || o.ReadToken != ""
	s.adminSum = sha256.Sum256([]byte(o.AdminToken))
	s.readSum = sha256.Sum256([]byte(o.ReadToken))
	s.metrics = newMetrics(o.Registry, o.Snapshot)
	o.Registry.MustRegister(envoyCollector{reg: o.Envoys, snap: o.Snapshot})
	s.routes()
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Drain makes every open long poll answer now (304, or 404 for a policy that
// does not exist) and new ones answer without waiting. Call it before
// http.Server.Shutdown so that shutdown does not wait for long polls.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// role is what a request's token allows.
type role int

const (
	roleNone role = iota
	roleRead
	roleAdmin
	roleOpen // authentication disabled: may do everything
)

// String is the role's name in history actors: admin, read, or anonymous
// when authentication is off.
func (r role) String() string {
	switch r {
	case roleAdmin:
		return "admin"
	case roleRead:
		return "read"
	case roleOpen:
		return "anonymous"
	}
	return "none"
}

// access is what a route method needs.
type access int

const (
	public access = iota // no token (health, readiness, metrics)
	read
	write
)

type handler func(w http.ResponseWriter, r *http.Request, who role)

// route registers pattern with its methods; other methods get a JSON 405.
func (s *Server) route(pattern string, methods map[string]handler, need map[string]access) {
	allow := make([]string, 0, len(methods))
	for m := range methods {
		allow = append(allow, m)
	}
	sortStrings(allow)
	allowHeader := strings.Join(allow, ", ")
	s.mux.Handle(pattern, s.instrument(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := methods[r.Method]
		if !ok {
			w.Header().Set("Allow", allowHeader)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method "+r.Method+" not allowed; allowed: "+allowHeader, nil)
			return
		}
		if !s.authOn && !s.checkOpen(w, r) {
			return
		}
		who, ok := s.authorize(w, r, need[r.Method])
		if !ok {
			return
		}
		h(w, r, who)
	})))
}

// authorize checks the bearer token against what the request needs (RFC 6750
// §2.1 header form; §3 WWW-Authenticate on 401).
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, need access) (role, bool) {
	if need == public {
		return roleNone, true
	}
	if !s.authOn {
		return roleOpen, true
	}
	if need == read && s.o.ReadIdentity != nil && r.Header.Get("Authorization") == "" {
		if _, ok := s.o.ReadIdentity(r); ok {
			return roleRead, true
		}
	}
	token, ok := httpjson.BearerToken(w, r)
	if !ok {
		return roleNone, false
	}
	sum := sha256.Sum256([]byte(token))
	who := roleNone
	if s.o.AdminToken != "" && subtle.ConstantTimeCompare(sum[:], s.adminSum[:]) == 1 {
		who = roleAdmin
	} else if s.o.ReadToken != "" && subtle.ConstantTimeCompare(sum[:], s.readSum[:]) == 1 {
		who = roleRead
	}
	switch {
	case who == roleNone:
		httpjson.Forbidden(w, "invalid_token", "the bearer token is not valid")
		httpjson.LogRefusedToken(s.log, &s.lastBadToken, r, "neither the admin nor the read token")
		return roleNone, false
	case need == write && who != roleAdmin:
		httpjson.Forbidden(w, "insufficient_scope", "writes need the admin token")
		return roleNone, false
	}
	return who, true
}

// GuardOpen wraps a handler served beside the API (the quota service) with the
// checks of unauthenticated mode that the API's own routes get: without tokens, a
// request whose Host is not a loopback name or address, or a write whose Origin is
// not this server, is answered 403 (forbidden_host, forbidden_origin) and never
// reaches h. With tokens configured it returns h unchanged.
func (s *Server) GuardOpen(h http.Handler) http.Handler {
	if s.authOn {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.checkOpen(w, r) {
			h.ServeHTTP(w, r)
		}
	})
}

// checkOpen applies the checks of unauthenticated (open) mode: a loopback
// Host, and on writes no foreign Origin. It answers 403 and returns false
// when one fails.
func (s *Server) checkOpen(w http.ResponseWriter, r *http.Request) bool {
	if !loopbackHost(r.Host) {
		writeError(w, http.StatusForbidden, "forbidden_host",
			"Host "+strconv.Quote(r.Host)+" is not a loopback name or address; without tokens only localhost, 127.0.0.0/8 and [::1] are served (configure tokens to serve other names)", nil)
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	if origin, ok := r.Header["Origin"]; ok && (len(origin) != 1 || !sameOrigin(origin[0], r.Host)) {
		writeError(w, http.StatusForbidden, "forbidden_origin",
			"cross-origin write refused: Origin "+strconv.Quote(strings.Join(origin, ", "))+" is not this server (http://"+r.Host+")", nil)
		return false
	}
	return true
}

// loopbackHost reports whether a Host header value (host, host:port, [v6]
// or [v6]:port; RFC 9110 §7.2) names this machine: "localhost" (any case) or
// a loopback IP address.
func loopbackHost(h string) bool {
	host, port := h, ""
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return false
		}
		host, port = h[1:end], h[end+1:]
		if port != "" && port[0] != ':' {
			return false
		}
	} else if i := strings.LastIndexByte(h, ':'); i >= 0 {
		host, port = h[:i], h[i:]
	}
	if port != "" {
		if _, err := strconv.ParseUint(port[1:], 10, 16); err != nil {
			return false
		}
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sameOrigin reports whether origin (RFC 6454 §7 serialization) is
// http://host, the origin of this plain-HTTP server reached as host; default
// ports are made explicit on both sides.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "" || u.User != nil {
		return false
	}
	withPort := func(h string) string {
		if strings.HasSuffix(h, "]") || !strings.Contains(h, ":") {
			return h + ":80"
		}
		return h
	}
	return strings.EqualFold(withPort(u.Host), withPort(host))
}

func (s *Server) routes() {
	s.route("/v1/policies", map[string]handler{http.MethodGet: s.listPolicies}, map[string]access{http.MethodGet: read})
	s.route("/v1/policies/{policy}",
		map[string]handler{http.MethodGet: s.getPolicy, http.MethodPut: s.putPolicy, http.MethodDelete: s.deletePolicy},
		map[string]access{http.MethodGet: read, http.MethodPut: write, http.MethodDelete: write})
	s.route("/v1/policies/{policy}/rules",
		map[string]handler{http.MethodPost: s.addRule},
		map[string]access{http.MethodPost: write})
	s.route("/v1/policies/{policy}/rules/{id}",
		map[string]handler{http.MethodGet: s.getRule, http.MethodPut: s.putRule, http.MethodDelete: s.deleteRule},
		map[string]access{http.MethodGet: read, http.MethodPut: write, http.MethodDelete: write})
	s.route("/v1/policies/{policy}/versions",
		map[string]handler{http.MethodGet: s.listVersions}, map[string]access{http.MethodGet: read})
	s.route("/v1/policies/{policy}/versions/{version}",
		map[string]handler{http.MethodGet: s.getVersion}, map[string]access{http.MethodGet: read})
	s.route("/v1/policies/{policy}/status",
		map[string]handler{http.MethodGet: s.policyStatus}, map[string]access{http.MethodGet: read})
	s.route("/v1/policies/{policy}/rollback",
		map[string]handler{http.MethodPost: s.rollback}, map[string]access{http.MethodPost: write})
	s.route("/healthz", map[string]handler{http.MethodGet: s.healthz}, nil)
	s.route("/readyz", map[string]handler{http.MethodGet: s.readyz}, nil)
	s.route("/metrics", map[string]handler{http.MethodGet: s.serveMetrics}, nil)
	s.mux.Handle("/", s.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path, nil)
	})))
}

func sortStrings(a []string) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}
