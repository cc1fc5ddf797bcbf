// Package quota is the control plane's quota service: it leases shares of the
// fleet-wide limits of "scope": "fleet" rules to Envoys (POST /v1/quota, messages of
// package shared/quota).
//
// The global state of each counter key of a fleet rule lives in a Backend (Redis, or
// memory with the embedded store) and is decided with the rule's own shared/limit
// algorithm by compare-and-swap: load the key's value, decide in Go, store it back iff
// it is unchanged (a Lua script on Redis), retry on conflict. Concurrent asks for one
// key are combined into one such round per replica (combine.go), so contention is
// queued, never refused: a key that cannot be decided in time is answered
// quota.StatusRetry. A grant of n units is a
// Decide of cost n; returned units are an Adjust of -n, credited only while the
// Envoy's lease is live, at most what it holds. See docs/fleet.md
// for the bound of each algorithm and the sizing rule.
//
// Failure policy: when the backend fails or does not answer within Options.Timeout
// the call is answered 503 at once and nothing is granted; a grant is only ever
// answered after the backend recorded it.
package quota

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/controlplane/internal/httpjson"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Policies is where the service reads the current policies (snapshot.Snapshot).
type Policies interface {
	// Get returns the current record of a policy, false if never seen.
	Get(name string) (store.Record, bool)
}

// Options configure New.
type Options struct {
	// Backend holds the global state. Required.
	Backend Backend
	// Policies gives the current policies. Required.
	Policies Policies
	// Token is the quota bearer token. Empty: quota calls are refused (403) unless
	// Open is set.
	Token string
	// Open allows quota calls without a token when Token is empty (the control
	// plane runs without authentication, on loopback only).
	Open bool
	// Timeout bounds each backend call (default 250ms; past it the request is
	// answered 503), the time an ask waits queued behind other asks for its key, and
	// the conflict retries of a round (past those two, the key is answered
	// quota.StatusRetry).
	Timeout time.Duration
	// Identity selects who an Envoy is (default IdentityBody: the request's
	// "envoy" field). With IdentityCertificate the verified certificate alone
	// authenticates the call (Token is not asked for); with IdentityXFCC a
	// configured Token is still required. With either the ledger is keyed
	// under the identity: a caller reports, returns and reads only its own entries,
	// whatever its "envoy" field says.
	Identity IdentityMode
	// MaxEntriesPerIdentity bounds the ledger entries one identity holds per key
	// (default DefaultMaxEntriesPerIdentity): a further Envoy id of that identity
	// is answered retry until the sweep has forgotten one of its entries whose
	// Envoy stopped reporting (forgetAfter); no live lease is ever cut short.
	MaxEntriesPerIdentity int
	// MaxEntriesPerKey bounds a key's ledger entries (default MaxEnvoysPerKey): a
	// further Envoy is answered retry until the sweep has forgotten one.
	MaxEntriesPerKey int
	// Limits bound a request (defaults shared/quota's).
	Limits quota.Limits
	// Validity is the longest lease of a token_bucket or gcra key (default
	// DefaultValidity), unless one unit refills more slowly: then a lease lasts one
	// unit's refill time.
	Validity time.Duration
	// Now is the clock in Unix nanoseconds (default time.Now().UnixNano).
	Now func() int64
	// Registry receives the metrics; nil registers none.
	Registry *prometheus.Registry
	// Logger receives backend errors; nil means slog.Default().
	Logger *slog.Logger
}

// Service is the quota endpoint's http.Handler.
type Service struct {
	o        Options
	tokenSum [32]byte
	log      *slog.Logger
	m        *metrics

	comb     *combiner
	sweeps   sweeper
	reads    readCache
	mu       sync.Mutex
	cache    map[cacheKey]*compiled
	lastWarn atomic.Int64
	// lastCorruptLog is when failUndecodable last logged, Unix ns.
	lastCorruptLog atomic.Int64
	// lastBadToken is when a refused token was last logged, Unix ns.
	lastBadToken atomic.Int64
}

// cacheKey identifies a compiled policy. A version number alone is not enough: a
// policy the store lost is written back as version 1 of a new epoch, so (version,
// epoch) and the document's sum both go in.
type cacheKey struct {
	policy     string
	ver        uint64
	epoch, sum string
	env        string
}

type compiled struct {
	c     *rules.Compiled
	byID  map[string]int
	fleet []*fleetLimiter // per rule; nil when not fleet
	pfx   []string        // per rule: storage key prefix
}

// New returns the service.
func New(o Options) *Service {
	if o.Timeout <= 0 {
		o.Timeout = 250 * time.Millisecond
	}
	if o.Validity <= 0 {
		o.Validity = DefaultValidity
	}
	if o.MaxEntriesPerKey <= 0 {
		o.MaxEntriesPerKey = MaxEnvoysPerKey
	}
	if o.MaxEntriesPerIdentity <= 0 {
		o.MaxEntriesPerIdentity = DefaultMaxEntriesPerIdentity
	}
	if o.Limits.MaxBytes <= 0 {
		o.Limits.MaxBytes = quota.DefaultMaxBytes
	}
	if o.Limits.MaxKeys <= 0 {
		o.Limits.MaxKeys = quota.DefaultMaxKeys
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Service{o: o, log: o.Logger, cache: make(map[cacheKey]*compiled), tokenSum: sha256.Sum256([]byte(o.Token))}
	s.m = newMetrics(o.Registry)
	s.comb = newCombiner()
	s.sweeps.now = o.Now
	return s
}

// StorageKey returns the backend key of counter key under a rule of fingerprint fp:
// "{}sq2:<fp hex>:<counter key>" (2: the split layout of ledger.go; a key of the
// earlier layout, one string value, is never read). The leading "{}" is an empty hash tag, so Redis
// Cluster hashes the whole key (https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags)
// whatever braces a key value holds; the fingerprint makes a changed rule start
// afresh.
func StorageKey(fp uint64, key string) string {
	return "{}sq2:" + strconv.FormatUint(fp, 16) + ":" + key
}

func (s *Service) compile(rec store.Record, env string) (*compiled, error) {
	k := cacheKey{rec.Name, rec.Version, rec.Epoch, rec.Sum, env}
	s.mu.Lock()
	c, ok := s.cache[k]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	p, err := rules.ParsePolicy(rec.Doc)
	if err != nil {
		return nil, err
	}
	if c, err = s.compilePolicy(p, env); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.cache) >= 64 {
		clear(s.cache)
	}
	s.cache[k] = c
	s.mu.Unlock()
	return c, nil
}

// compilePolicy compiles p for env with its rules' fleet limiters.
func (s *Service) compilePolicy(p *rules.Policy, env string) (*compiled, error) {
	rc, err := rules.Compile(p, rules.CompileOptions{Env: env})
	if err != nil {
		return nil, err
	}
	c := &compiled{c: rc, byID: make(map[string]int, rc.Len()), fleet: make([]*fleetLimiter, rc.Len()), pfx: make([]string, rc.Len())}
	for i := 0; i < rc.Len(); i++ {
		r := rc.Rule(i)
		c.byID[r.ID] = i
		if r.Fleet() {
			if f, err := newFleetLimiter(r.Config, s.o.Validity); err == nil {
				c.fleet[i] = f
			}
		}
		c.pfx[i] = StorageKey(r.Fingerprint, "")
	}
	return c, nil
}

// ServeHTTP answers POST /v1/quota.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	code := s.serve(w, r)
	s.m.observe(code, time.Since(start))
}

func (s *Service) serve(w http.ResponseWriter, r *http.Request) int {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST", nil)
	}
	// A verified client certificate authenticates the call by itself; otherwise the
	// quota token does (also behind a sidecar whose header names the identity).
	if s.o.Identity != IdentityCertificate {
		if code, ok := s.authorize(w, r); !ok {
			return code
		}
	}
	owner, code, ok := s.identify(w, r)
	if !ok {
		return code
	}
	if msg, ok := httpjson.CheckJSON(r); !ok {
		return writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", msg, nil)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.o.Limits.MaxBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return writeError(w, http.StatusRequestEntityTooLarge, "too_large", "request body over "+strconv.Itoa(s.o.Limits.MaxBytes)+" bytes", nil)
		}
		return writeError(w, http.StatusBadRequest, "bad_request", "reading the body: "+err.Error(), nil)
	}
	req, err := quota.DecodeRequest(body, s.o.Limits)
	if err != nil {
		var tl *quota.TooLargeError
		var fe quota.Errors
		switch {
		case errors.As(err, &tl):
			return writeError(w, http.StatusRequestEntityTooLarge, "too_large", tl.Message, []httpjson.Detail{{Field: tl.Field, Message: tl.Message}})
		case errors.As(err, &fe):
			d := make([]httpjson.Detail, len(fe))
			for i, e := range fe {
				d[i] = httpjson.Detail{Field: e.Field, Message: e.Message}
			}
			return writeError(w, http.StatusBadRequest, "invalid_document", "the request is malformed: "+fe.Error(), d)
		}
		return writeError(w, http.StatusBadRequest, "invalid_document", err.Error(), nil)
	}
	resp, err := s.HandleFor(r.Context(), owner, req)
	if err != nil {
		if now := time.Now().UnixNano(); now-s.lastWarn.Load() >= int64(time.Second) {
			s.lastWarn.Store(now) // at most about one warning a second during an outage
			s.log.Warn("quota: backend unavailable", "err", err)
		}
		w.Header().Set("Retry-After", "1")
		msg := "the quota store did not answer; nothing was granted"
		if errors.Is(err, ErrMemoryFull) {
			msg = "the in-memory quota store is full (" + strconv.Itoa(DefaultMemoryMaxKeys) + " counter keys by default); nothing was granted"
		}
		return writeError(w, http.StatusServiceUnavailable, "store_unavailable", msg, nil)
	}
	// Charges are booked (settle): a client that reads the member learns so.
	resp.Charges = r.Header.Get(quota.ChargeHeader) != ""
	envoys, left := r.Header.Get(quota.EnvoysHeader) != "", r.Header.Get(quota.LeftHeader) != ""
	for i := range resp.Keys {
		// A client that does not read a member never gets it.
		if !envoys {
			resp.Keys[i].Envoys = 0
		}
		if !left {
			resp.Keys[i].Left, resp.Keys[i].LeftFor = 0, 0
		}
	}
	httpjson.WriteRaw(w, http.StatusOK, quota.AppendResponse(make([]byte, 0, 64+len(resp.Keys)*160), resp))
	return http.StatusOK
}

// authorize checks the quota bearer token (RFC 6750 §2.1, read by
// httpjson.BearerToken as the API reads its tokens), in constant time over its
// SHA-256: none 401, wrong 403.
func (s *Service) authorize(w http.ResponseWriter, r *http.Request) (int, bool) {
	if s.o.Token == "" {
		if s.o.Open || s.o.Identity == IdentityXFCC {
			return 0, true // no token at all (loopback), or the sidecar's header alone
		}
		return writeError(w, http.StatusForbidden, "forbidden", "quota calls are disabled: no quota token is configured (--quota-token)", nil), false
	}
	token, ok := httpjson.BearerToken(w, r)
	if !ok {
		return http.StatusUnauthorized, false
	}
	if !s.TokenOK(token) {
		httpjson.Forbidden(w, "invalid_token", "the bearer token is not the quota token")
		httpjson.LogRefusedToken(s.log, &s.lastBadToken, r, "not the quota token")
		return http.StatusForbidden, false
	}
	return 0, true
}

// work is one key being decided.
type work struct {
	idx  int // in the request
	f    *fleetLimiter
	skey string
}

// ErrUnavailable wraps backend errors returned by Handle.
var ErrUnavailable = errors.New("quota: backend unavailable")

// Handle decides a decoded request: it answers each key (see quota.KeyResult) and
// records every grant and return in the backend before returning. It returns an
// error wrapping ErrUnavailable, and grants nothing, when the backend does not
// answer within Options.Timeout.
func (s *Service) Handle(ctx context.Context, req *quota.Request) (*quota.Response, error) {
	return s.HandleFor(ctx, "", req)
}

// HandleFor is Handle for a caller of ledger owner owner (Owner of its identity; ""
// for none): its entries are named owner+req.Envoy.
func (s *Service) HandleFor(ctx context.Context, owner string, req *quota.Request) (*quota.Response, error) {
	resp := &quota.Response{Policy: req.Policy, Keys: make([]quota.KeyResult, len(req.Keys))}
	rec, _ := s.o.Policies.Get(req.Policy)
	if rec.Exists() {
		resp.Version = rec.Version
	}
	var c *compiled
	if rec.Exists() && rec.Version == req.Version {
		var err error
		if c, err = s.compile(rec, req.Env); err != nil {
			c = nil // a stored policy that does not compile for this env: stale for the Envoy
		}
	}
	start := time.Now()
	var asks []keyAsk
	for i := range req.Keys {
		k := &req.Keys[i]
		res := &resp.Keys[i]
		res.Key = k.Key
		if c == nil {
			res.Status = quota.StatusStalePolicy
			continue
		}
		ri, ok := c.byID[k.Rule]
		switch {
		case !ok:
			res.Status = quota.StatusUnknownRule
		case c.fleet[ri] == nil:
			res.Status = quota.StatusNotFleet
		case !c.c.Rule(ri).OwnsKey(k.Key):
			res.Status = quota.StatusBadKey
		default:
			asks = append(asks, keyAsk{w: work{idx: i, f: c.fleet[ri], skey: c.pfx[ri] + k.Key}, envoy: EntryName(owner, req.Envoy), owner: owner, k: k, interval: req.Interval})
			s.m.touch(req.Policy, k.Rule, k.Key)
		}
	}
	resp.Now = s.o.Now()
	if len(asks) > 0 {
		s.decideAll(ctx, asks, start.Add(s.o.Timeout))
		for i := range asks {
			a := &asks[i]
			if a.err != nil {
				return nil, errors.Join(ErrUnavailable, a.err)
			}
			resp.Keys[a.w.idx] = a.res
			resp.Now = max(resp.Now, a.at)
		}
	}
	s.m.count(req, resp)
	return resp, nil
}

// writeError answers status with the control plane's one error body
// (httpjson.WriteError) and returns status.
func writeError(w http.ResponseWriter, status int, code, message string, details []httpjson.Detail) int {
	httpjson.WriteError(w, status, code, message, details)
	return status
}
