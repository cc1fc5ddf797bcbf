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
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/controlplane/internal/grpcauth"
	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// Defaults of Options.
const (
	DefaultMargin              = 250 * time.Millisecond
	DefaultMaxStreams          = 10000
	DefaultMaxBucketsPerStream = 10000
	// DefaultMaxBuckets and DefaultMaxBucketsPerIdentity bound the buckets tracked
	// by the whole process and by the streams of one identity. A bucket costs at
	// most about bucketBytes whatever its id's size (only a digest of the id is
	// kept), so the defaults hold the buckets under about 100 MiB and 20 MiB.
	DefaultMaxBuckets            = 250000
	DefaultMaxBucketsPerIdentity = 50000
	DefaultIdleAfter             = time.Minute
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
	// MaxBuckets bounds the buckets of all streams together (default
	// DefaultMaxBuckets), MaxBucketsPerIdentity those of one identity's streams
	// (default DefaultMaxBucketsPerIdentity; all token callers are one identity); a
	// further bucket is abandoned.
	MaxBuckets, MaxBucketsPerIdentity int
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
	// refusals logs streams refused for their credentials.
	refusals grpcauth.RefusalLog

	bucketsMu sync.Mutex
	buckets   int            // buckets tracked by all streams
	byOwner   map[string]int // buckets tracked by the streams of each ledger owner

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
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = DefaultMaxBuckets
	}
	if o.MaxBucketsPerIdentity <= 0 {
		o.MaxBucketsPerIdentity = DefaultMaxBucketsPerIdentity
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
	return &Server{o: o, m: newMetrics(o.Registry), log: o.Logger, warned: make(map[string]int64), byOwner: make(map[string]int)}
}

// Flow-control windows of the gRPC server, bytes: what a client may send on a
// stream (StreamWindowBytes) and on a connection (ConnWindowBytes) before the
// server has read it. Fixed windows turn off grpc-go's estimate of the
// bandwidth-delay product, which grows them to 16 MiB a stream and a connection,
// so that a client flooding streams faster than the server reads makes it buffer
// hundreds of MiB; with these, unread data stays under ConnWindowBytes a
// connection (HTTP/2, RFC 9113 section 6.9).
const (
	StreamWindowBytes = 256 << 10
	ConnWindowBytes   = 1 << 20
)

// NewGRPCServer returns a gRPC server serving s, the services also registers
// (each returns its service name) and the standard health service
// (grpc.health.v1.Health: SERVING for "", the RLQS service and those), bounded
// to MaxMessageBytes per received message, 1,000 streams a connection and the
// flow-control windows above. creds is nil for plaintext.
func NewGRPCServer(s *Server, creds credentials.TransportCredentials, also ...func(*grpc.Server) string) *grpc.Server {
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxConcurrentStreams(1000),
		grpc.InitialWindowSize(StreamWindowBytes), grpc.InitialConnWindowSize(ConnWindowBytes),
		// Unary calls (the RateLimitService's) run on a pool of goroutines whose
		// stacks have grown, not on a new goroutine each; when all are busy (an
		// RLQS stream holds one for its life) a call gets a goroutine of its own.
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0)))}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	g := grpc.NewServer(opts...)
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	for _, register := range also {
		h.SetServingStatus(register(g), healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(g, h)
	return g
}

// authenticate returns the ledger owner of the stream's caller (grpcauth.Owner).
func (s *Server) authenticate(ctx context.Context) (string, error) {
	return grpcauth.Owner(ctx, s.o.Quota, "RLQS streams")
}

// StreamRateLimitQuotas serves one Envoy's stream: every usage report is answered
// with one response holding an action for each bucket that needs one.
func (s *Server) StreamRateLimitQuotas(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	owner, err := s.authenticate(st.Context())
	if err != nil {
		s.m.refused.Inc()
		s.refusals.Note(st.Context(), s.log, "an RLQS stream", err)
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
	defer ss.close()
	// Follow-ups run beside the reports, on their own goroutine: mu orders the
	// two over the stream's state and its sends, and the stream's end waits for it.
	ctx, cancel := context.WithCancel(st.Context())
	wake := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- s.followUpLoop(ctx, ss, st, wake) }()
	defer func() { cancel(); <-done }()
	for {
		msg, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		select {
		case err := <-done:
			done <- err // for the deferred wait
			return err
		default:
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
		ss.mu.Lock()
		err = s.answer(st, ss, func() (*rlqsv3.RateLimitQuotaResponse, []func(int64)) { return ss.handle(st.Context(), msg) })
		ss.mu.Unlock()
		if err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default:
		}
		s.m.duration.Observe(time.Since(start).Seconds())
	}
}

// answer runs one round of ss (a report's or the follow-ups'), sends its
// response if it has actions, and records what was sent at the time after the
// send. The caller holds ss.mu.
func (s *Server) answer(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, ss *stream, round func() (*rlqsv3.RateLimitQuotaResponse, []func(int64))) error {
	resp, after := round()
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
	return nil
}

// followUpTick is the shortest wait between two rounds of a stream's
// follow-ups: those due within it are answered together, so a stream of many
// buckets scans them at most this often.
const followUpTick = 100 * time.Millisecond

// followUpLoop answers ss's follow-ups when they fall due (stream.followUps),
// until ctx ends or a send fails; wake says a report's answer may have moved the
// next one.
func (s *Server) followUpLoop(ctx context.Context, ss *stream, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, wake <-chan struct{}) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ss.mu.Lock()
		next := ss.nextFollowUp()
		ss.mu.Unlock()
		wait := time.Hour
		if next > 0 {
			wait = max(time.Duration(next-s.o.Now()), followUpTick)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			continue
		case <-timer.C:
		}
		ss.mu.Lock()
		err := s.answer(st, ss, func() (*rlqsv3.RateLimitQuotaResponse, []func(int64)) { return ss.followUps(ctx) })
		ss.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// abandoned counts an abandoned bucket and logs it, at most once per reason every
// 10 s, naming the bucket's policy, rule and entry names but none of its values
// (a client chooses them: a log line stays short whatever it sends).
func (s *Server) abandoned(reason, domain string, id *rlqsv3.BucketId) {
	s.m.abandoned.WithLabelValues(reason).Inc()
	s.m.actions.WithLabelValues("abandon").Inc()
	entries := id.GetBucket()
	names := make([]string, 0, min(len(entries), 8))
	for name := range entries {
		if len(names) == cap(names) {
			break
		}
		if name != EntryPolicy && name != EntryRule {
			names = append(names, clip(name))
		}
	}
	slices.Sort(names)
	s.warn("abandon:"+reason, "rlqs: bucket abandoned", "reason", reason, "domain", clip(domain),
		"policy", clip(entries[EntryPolicy]), "rule", clip(entries[EntryRule]), "entries", names, "entry_count", len(entries))
}

// clip cuts a client's string to 64 bytes for a log line.
func clip(v string) string {
	if len(v) > 64 {
		return v[:64] + "…"
	}
	return v
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
