// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService, the server side of the
// native envoy.filters.http.rate_limit_quota filter) from sluice's fleet budgets:
// the same counter keys, decided by the quota service's rounds (quota.Service.Assign)
// in the same ledger as the Wasm filter's leases, so Envoys of both kinds spend one
// budget.
//
// Each usage report is answered at once, one action per bucket: a token bucket the
// Envoy may spend until it is replaced or its TTL ends, every token of which was
// first taken from the fleet budget; DENY_ALL when the budget is spent; ALLOW_ALL
// for an exempt client; an AbandonAction, counted and logged, for a bucket that
// names no fleet rule or lacks a key part. docs/rlqs.md has what Envoy's filter
// does with each, the mapping and the bounds.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	sq "github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Defaults of Options.
const (
	DefaultMargin              = 250 * time.Millisecond
	DefaultMaxStreams          = 10000
	DefaultMaxBucketsPerStream = 10000
	DefaultIdleAfter           = time.Minute
	// MaxMessageBytes bounds a received message (a report of many buckets).
	MaxMessageBytes = 1 << 20
)

// Options configure New.
type Options struct {
	// Quota decides the assignments and authenticates as POST /v1/quota does (its
	// token, identity mode). Required.
	Quota *quota.Service
	// Margin is the longest time assumed from deciding a key until the Envoy applies
	// the answer, its expiry timer's lateness included, and from an Envoy sending a
	// report until it arrives (default DefaultMargin): an assignment is given a TTL
	// that ends that much before its lease, and its unspent units are returned only
	// once reports sent after it ended have arrived.
	Margin time.Duration
	// MaxStreams bounds the streams served at once (default DefaultMaxStreams); a
	// further one is refused RESOURCE_EXHAUSTED.
	MaxStreams int
	// MaxBucketsPerStream bounds the buckets one stream tracks (default
	// DefaultMaxBucketsPerStream); a further bucket is abandoned.
	MaxBucketsPerStream int
	// IdleAfter is how long a bucket may report no request before it is abandoned
	// (default DefaultIdleAfter): the Envoy forgets it and the stream frees it.
	IdleAfter time.Duration
	// Now is the clock in Unix nanoseconds (default time.Now().UnixNano).
	Now func() int64
	// Registry receives the metrics; nil registers none.
	Registry *prometheus.Registry
	// Logger receives abandoned buckets and failures; nil means slog.Default().
	Logger *slog.Logger
}

// Server is the RateLimitQuotaService.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	o       Options
	m       *metrics
	log     *slog.Logger
	streams atomic.Int64

	warnMu sync.Mutex
	warned map[string]int64 // reason → last log time
}

// New returns the service.
func New(o Options) *Server {
	if o.Margin <= 0 {
		o.Margin = DefaultMargin
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxBucketsPerStream <= 0 {
		o.MaxBucketsPerStream = DefaultMaxBucketsPerStream
	}
	if o.IdleAfter <= 0 {
		o.IdleAfter = DefaultIdleAfter
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Server{o: o, m: newMetrics(o.Registry), log: o.Logger, warned: make(map[string]int64)}
}

// NewGRPCServer returns a gRPC server serving s and the standard health service
// (grpc.health.v1.Health: SERVING for "" and for the RLQS service), bounded to
// MaxMessageBytes per received message. creds is nil for plaintext.
func NewGRPCServer(s *Server, creds credentials.TransportCredentials) *grpc.Server {
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxConcurrentStreams(1000)}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	g := grpc.NewServer(opts...)
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	return g
}

// authenticate returns the ledger owner of the stream's caller, as POST /v1/quota
// decides it: a verified client certificate (identity mode certificate), else the
// quota token in "authorization: Bearer …" metadata (Envoy's grpc_service
// initial_metadata), with the sidecar's x-forwarded-client-cert naming the identity
// in XFCC mode.
func (s *Server) authenticate(ctx context.Context) (string, error) {
	q := s.o.Quota
	md, _ := metadata.FromIncomingContext(ctx)
	switch q.Identity() {
	case quota.IdentityCertificate:
		p, ok := peer.FromContext(ctx)
		var info credentials.TLSInfo
		if ok {
			info, ok = p.AuthInfo.(credentials.TLSInfo)
		}
		if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
			return "", status.Error(codes.Unauthenticated, "RLQS streams need a client certificate signed by the control plane's client CA (--client-ca-file)")
		}
		id := quota.CertificateIdentity(info.State.VerifiedChains[0][0])
		if id == "" {
			return "", status.Error(codes.PermissionDenied, "the client certificate has neither a URI nor a DNS subject alternative name to identify the Envoy by")
		}
		return quota.Owner(id), nil
	}
	required, refuseAll := q.TokenRequired()
	if refuseAll {
		return "", status.Error(codes.PermissionDenied, "quota calls are disabled: no quota token is configured (--quota-token)")
	}
	if required {
		auth := first(md, "authorization")
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || token == "" {
			return "", status.Error(codes.Unauthenticated, `RLQS streams need the quota token in "authorization: Bearer <token>" metadata`)
		}
		if !q.TokenOK(token) {
			return "", status.Error(codes.PermissionDenied, "the bearer token is not the quota token")
		}
	}
	if q.Identity() == quota.IdentityXFCC {
		id, err := quota.XFCCIdentity(md.Get("x-forwarded-client-cert"))
		if err != nil {
			return "", status.Error(codes.Unauthenticated, "RLQS streams need the x-forwarded-client-cert metadata of the mesh sidecar, with a URI or DNS in its last element (--trust-xfcc): "+err.Error())
		}
		return quota.Owner(id), nil
	}
	return "", nil
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// StreamRateLimitQuotas serves one Envoy's stream: every usage report is answered
// with one response holding an action for each bucket that needs one.
func (s *Server) StreamRateLimitQuotas(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	owner, err := s.authenticate(st.Context())
	if err != nil {
		s.m.refused.Inc()
		return err
	}
	if s.streams.Add(1) > int64(s.o.MaxStreams) {
		s.streams.Add(-1)
		s.m.refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "this control plane serves at most %d RLQS streams", s.o.MaxStreams)
	}
	s.m.streams.Inc()
	defer func() { s.streams.Add(-1); s.m.streams.Dec() }()
	ss := s.newStream(owner)
	for {
		msg, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		start := time.Now()
		// Not msg.ValidateAll: Envoy sends time_elapsed in whole seconds, 0 for a new
		// bucket's first report and for sub-second intervals, which the message's own
		// rules (greater than 0s) reject. What the server reads is checked here.
		if msg.Domain == "" {
			s.m.invalid.Inc()
			return status.Error(codes.InvalidArgument, "invalid usage report: no domain")
		}
		s.m.reports.Inc()
		resp, after := ss.handle(st.Context(), msg)
		if len(resp.BucketAction) > 0 {
			if err := resp.ValidateAll(); err != nil {
				s.log.Error("rlqs: built an invalid response", "err", err)
				return status.Error(codes.Internal, "the server built an invalid response")
			}
			if err := st.Send(resp); err != nil {
				return err
			}
		}
		at := s.o.Now()
		for _, f := range after {
			f(at)
		}
		s.m.duration.Observe(time.Since(start).Seconds())
	}
}

// newStream returns the state of a new stream of ledger owner owner: its ledger
// entries are named (quota.EntryName) under owner "rlqs:" and 16 random hex digits.
func (s *Server) newStream(owner string) *stream {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &stream{s: s, owner: owner, entry: quota.EntryName(owner, "rlqs:"+hex.EncodeToString(id[:])), buckets: make(map[string]*bucket)}
}

// stream is one RLQS stream's state; only its own goroutine uses it.
type stream struct {
	s       *Server
	owner   string
	entry   string // its ledger entries' name
	buckets map[string]*bucket
}

// canonical returns a bucket id's map as one string: sorted key, value pairs.
func canonical(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(m[k])
		b.WriteByte(0)
	}
	return b.String()
}

// handle answers one report; after holds what to record once the response is sent
// (called with the time after the send).
func (ss *stream) handle(ctx context.Context, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, []func(int64)) {
	s := ss.s
	now := s.o.Now()
	margin := s.o.Margin
	minLife := time.Second + margin
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var after []func(int64)
	var asks []quota.Assignment
	var askFor []*bucket
	var idFor []*rlqsv3.BucketId
	abandon := func(id *rlqsv3.BucketId, key, reason string) {
		delete(ss.buckets, key)
		resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
		s.abandoned(reason, msg.Domain, id)
	}
	seen := make(map[string]struct{}, len(msg.BucketQuotaUsages))
	for _, u := range msg.BucketQuotaUsages {
		entries := u.GetBucketId().GetBucket()
		if len(entries) == 0 || u.GetBucketId().ValidateAll() != nil {
			s.m.invalid.Inc()
			continue // no entries, or an empty name or value: no valid answer can name it
		}
		key := canonical(entries)
		if _, dup := seen[key]; dup {
			s.m.invalid.Inc()
			continue // one answer per bucket: a repeat in the same report is ignored
		}
		seen[key] = struct{}{}
		b := ss.buckets[key]
		if b == nil && len(ss.buckets) >= s.o.MaxBucketsPerStream {
			abandon(u.BucketId, key, ReasonTooManyBuckets)
			continue
		}
		policy, rule := entries[EntryPolicy], entries[EntryRule]
		if policy == "" || rule == "" {
			abandon(u.BucketId, key, ReasonNoPolicyEntry)
			continue
		}
		fr, reason := s.o.Quota.Resolve(policy, msg.Domain, rule)
		if fr == nil {
			abandon(u.BucketId, key, reason)
			continue
		}
		if r := fr.Rule.Rule; r.CostHeader != "" || r.Cost > 1 {
			abandon(u.BucketId, key, ReasonCost)
			continue
		}
		if fr.MaxLease() < minLife {
			abandon(u.BucketId, key, ReasonLeaseTooShort)
			continue
		}
		req, reason := request(entries)
		if reason != "" {
			abandon(u.BucketId, key, reason)
			continue
		}
		if fr.Exempt(&req) {
			delete(ss.buckets, key)
			ttl := ss.ttlFor(nil)
			resp.BucketAction = append(resp.BucketAction, blanket(u.BucketId, typev3.RateLimitStrategy_ALLOW_ALL, ttl))
			s.m.actions.WithLabelValues("allow_all").Inc()
			continue
		}
		ckey, ok := fr.Key(&req)
		if !ok {
			abandon(u.BucketId, key, ReasonMissingKeyPart)
			continue
		}
		if b == nil || b.key != ckey || b.rule.Rule.Fingerprint != fr.Rule.Fingerprint {
			// A new counter (first report, or a rule whose counters restarted): units of
			// the old one are forfeited, never returned into the new one.
			b = &bucket{id: key, key: ckey, nanos: mrand.Int32N(999999999) + 1}
			ss.buckets[key] = b
		}
		b.rule = fr
		// Counts are the client's: bounded as the quota protocol bounds units, so no
		// sum below can wrap.
		allowed, denied := min(u.NumRequestsAllowed, sq.MaxUnits), min(u.NumRequestsDenied, sq.MaxUnits)
		if most := b.admittable(now, fr.Rule.Config, fr.Rule.Rule.QuotaFailure() != rules.QuotaFailureDeny); allowed > most {
			allowed = most
			s.m.clamped.Inc()
			s.warn("clamped", "rlqs: a report counted more requests allowed than the bucket could admit; clamped", "domain", msg.Domain, "reported", u.NumRequestsAllowed, "clamped_to", most)
		}
		b.report(now, allowed, margin)
		switch {
		case allowed+denied > 0 || b.lastDemand == 0:
			b.lastDemand = now
		case now-b.lastDemand >= int64(s.o.IdleAfter):
			abandon(u.BucketId, key, ReasonIdle)
			continue
		}
		interval := b.observe(now)
		var want uint64
		if d := allowed + denied; d > 0 {
			// What the last report interval asked for (denied requests are demand too)
			// and one more, and what the refill of the assignment's TTL reserves on top.
			// No more headroom: a grant replaces the last, so what an Envoy leaves
			// unspent is lost to the fleet until it settles, two reports later.
			need := d + 1
			want = need + need*uint64(ttlSeconds(interval)+1)/uint64(refillPeriod/time.Second)
		}
		ret := b.toReturn()
		var charge uint64
		if fr.Rule.Rule.QuotaFailure() != rules.QuotaFailureDeny {
			charge = b.toCharge()
		}
		if want == 0 && ret == 0 && charge == 0 && b.unrecordedUsed == 0 {
			continue
		}
		asks = append(asks, quota.Assignment{Rule: fr, Key: ckey, Entry: ss.entry, Owner: ss.owner,
			Used: b.unrecordedUsed, Return: ret, Charge: charge, Want: want, Interval: interval, MinLife: minLife})
		askFor = append(askFor, b)
		idFor = append(idFor, u.BucketId)
	}
	if len(asks) == 0 {
		return resp, after
	}
	results, err := s.o.Quota.Assign(ctx, asks)
	if err != nil {
		// Nothing was recorded: every bucket keeps its assignment until its TTL, then
		// falls back as its settings say; the use is reported again next time.
		s.m.unavailable.Inc()
		s.warn("unavailable", "rlqs: quota store unavailable; buckets keep their assignments until they expire", "err", err)
		return resp, after
	}
	for i, r := range results {
		b, a := askFor[i], &asks[i]
		if r.Status == sq.StatusRetry {
			s.m.actions.WithLabelValues("none").Inc()
			continue // contended: nothing recorded, the same report goes again next time
		}
		b.unrecordedUsed = 0
		b.returned += a.Return
		b.owed -= min(b.owed, a.Charge)
		s.m.charged.Add(float64(a.Charge))
		if r.Tag != b.tag {
			b.newEpoch(r.Tag)
		}
		if r.Granted > 0 {
			ttl := min(time.Duration(r.End-r.Now)-margin, ss.ttlFor(b))
			ttl = ttl.Truncate(time.Second)
			tokens := uint64(0)
			if ttl >= time.Second {
				tokens = tokensFor(r.Granted, ttl)
			}
			if tokens == 0 {
				// Too late or too little to use: the units settle and return.
				b.pending = append(b.pending, sent{units: r.Granted, at: now})
				s.m.actions.WithLabelValues("none").Inc()
				continue
			}
			b.nanos = b.nanos%999999999 + 1 // a configuration Envoy has not got: a fresh bucket
			resp.BucketAction = append(resp.BucketAction, tokenBucket(idFor[i], tokens, b.nanos, ttl))
			s.m.actions.WithLabelValues("token_bucket").Inc()
			units, bb := r.Granted, b
			after = append(after, func(at int64) {
				bb.pending = append(bb.pending, sent{units: units, at: at, ttl: int64(ttl)})
				bb.credits = append(bb.credits, credit{left: units, at: at, ttl: int64(ttl)})
				bb.tbUntil = at + int64(ttl)
				bb.tokens = tokens
			})
			continue
		}
		if a.Want == 0 {
			continue // a report only
		}
		// Nothing granted: the budget is spent, or the lease ends too soon. A token
		// bucket that lives past the next report is still good to spend; otherwise
		// DENY_ALL until more may be granted.
		if b.tbUntil > now+int64(ss.ttlFor(b)) {
			s.m.actions.WithLabelValues("none").Inc()
			continue
		}
		ttl := max(r.RetryAfter, ss.ttlFor(b))
		ttl = min((ttl + time.Second - 1).Truncate(time.Second), time.Hour)
		resp.BucketAction = append(resp.BucketAction, blanket(idFor[i], typev3.RateLimitStrategy_DENY_ALL, ttl))
		s.m.actions.WithLabelValues("deny_all").Inc()
		bb := b
		after = append(after, func(at int64) {
			bb.pending = append(bb.pending, sent{at: at, ttl: int64(ttl)})
			bb.credits = append(bb.credits, credit{at: at, ttl: int64(ttl)})
			bb.tbUntil = 0
		})
	}
	return resp, after
}

// observe updates the bucket's estimate of the report interval with a report at
// now and returns it: the time between its reports (Envoy reports every bucket
// each reporting_interval), smoothed, 1 s until known, within 100 ms .. 1 min.
func (b *bucket) observe(now int64) time.Duration {
	if b.lastReport > 0 && now > b.lastReport {
		gap := time.Duration(now - b.lastReport)
		gap = min(max(gap, 100*time.Millisecond), time.Minute)
		if b.interval == 0 {
			b.interval = gap
		} else {
			b.interval = (3*b.interval + gap) / 4
		}
	}
	b.lastReport = now
	if b.interval == 0 {
		return time.Second
	}
	return b.interval
}

// ttlFor is the TTL of an assignment: past the next report's answer (one report
// interval, rounded up to whole seconds, plus a second), as Envoy takes whole
// seconds only.
func (ss *stream) ttlFor(b *bucket) time.Duration {
	iv := time.Second
	if b != nil && b.interval > 0 {
		iv = b.interval
	}
	return time.Duration(ttlSeconds(iv)+1) * time.Second
}

// ttlSeconds is d in whole seconds, rounded up.
func ttlSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// tokenBucket is an assignment of a fresh token bucket of tokens, refilling tokens
// per refillPeriod; nanos makes its configuration differ from the previous one, so
// that Envoy replaces its bucket instead of carrying it over.
func tokenBucket(id *rlqsv3.BucketId, tokens uint64, nanos int32, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(tokens),
		TokensPerFill: wrapperspb.UInt32(uint32(tokens)),
		FillInterval:  &durationpb.Duration{Seconds: int64(refillPeriod / time.Second), Nanos: nanos},
	}}})
}

func blanket(id *rlqsv3.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

func assignment(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    strategy,
		}}}
}

// abandoned counts an abandoned bucket and logs it, at most once per reason every
// 10 s.
func (s *Server) abandoned(reason, domain string, id *rlqsv3.BucketId) {
	s.m.abandoned.WithLabelValues(reason).Inc()
	s.m.actions.WithLabelValues("abandon").Inc()
	s.warn("abandon:"+reason, "rlqs: bucket abandoned", "reason", reason, "domain", domain, "bucket", id.GetBucket())
}

func (s *Server) warn(key, msg string, args ...any) {
	now := time.Now().UnixNano()
	s.warnMu.Lock()
	last := s.warned[key]
	ok := now-last >= int64(10*time.Second)
	if ok {
		s.warned[key] = now
	}
	s.warnMu.Unlock()
	if ok {
		s.log.Warn(msg, args...)
	}
}
