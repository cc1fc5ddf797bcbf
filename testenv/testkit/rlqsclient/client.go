// Package rlqsclient is an RLQS client that behaves as Envoy's
// envoy.filters.http.rate_limit_quota filter does, so that sluice's Rate Limit Quota
// Service is tested end to end without an Envoy binary: the same bucket cache, usage
// reports, assignments, token buckets, TTL expiry and fallback behaviours.
//
// It follows Envoy's source (source/extensions/filters/http/rate_limit_quota/filter.cc
// and global_client_impl.cc, source/common/common/token_bucket_impl.cc), written
// down in docs/rlqs.md:
//
//   - a request whose bucket is not cached creates it (its first request counted as
//     allowed or denied by no_assignment_behavior: only a blanket DENY_ALL denies),
//     and the bucket is reported at once;
//   - a cached bucket decides by its assignment, else by no_assignment_behavior:
//     ALLOW_ALL, DENY_ALL, or one token from its token bucket;
//     requests_per_time_unit allows everything;
//   - every 5 s all buckets are reported (counts reset as they are read): Envoy
//     hard-codes the interval (filter_persistence.cc: reporting_interval(5000), with
//     a TODO to honour each bucket's reporting_interval, which it ignores); with no
//     stream open, one is started, and if that fails the reports are dropped;
//   - an assignment replaces the bucket's; a token bucket is created afresh only
//     when max_tokens, tokens_per_fill or fill_interval.nanos differ from the
//     cached one, otherwise the old one (and its tokens) is carried over; a fresh
//     one starts full when the bucket had no token bucket, and otherwise as full
//     as the one it replaces (⌊max_tokens × remaining/old max⌋: Envoy's
//     createTokenBucketFromAction since envoyproxy/envoy#37624), so a bucket that
//     spent its tokens gets an empty one;
//     requests_per_time_unit assignments are ignored; an abandon action erases the
//     bucket; actions for buckets not cached are ignored;
//   - an assignment expires after assignment_time_to_live's whole seconds: then
//     expired_assignment_behavior's fallback applies for its timeout's whole
//     seconds, then no_assignment_behavior;
//   - a token bucket refills tokens_per_fill per fill_interval's whole seconds
//     (a zero there divides by zero: an unlimited bucket), never below one token a
//     year, and starts full unless filling it takes longer than the monotonic clock
//     has run (Envoy's ENVOY_BUG branch: it then starts empty).
package rlqsclient

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Clock is Envoy's monotonic time source and dispatcher timers.
type Clock interface {
	// Now is the monotonic time (Envoy reads it as seconds since the host booted).
	Now() time.Duration
	// AfterFunc runs f after d; the returned func stops it.
	AfterFunc(d time.Duration, f func()) (stop func())
}

// RealClock is the wall clock, its monotonic time starting at Uptime.
type RealClock struct {
	start  time.Time
	uptime time.Duration
}

// NewRealClock returns a RealClock whose monotonic time starts at uptime.
func NewRealClock(uptime time.Duration) *RealClock {
	return &RealClock{start: time.Now(), uptime: uptime}
}

// Now implements Clock.
func (c *RealClock) Now() time.Duration { return c.uptime + time.Since(c.start) }

// AfterFunc implements Clock.
func (c *RealClock) AfterFunc(d time.Duration, f func()) func() {
	t := time.AfterFunc(d, f)
	return func() { t.Stop() }
}

// Config is the filter's configuration, one bucket settings for every bucket (as a
// bucket_matchers tree whose actions share settings).
type Config struct {
	// Domain is RateLimitQuotaFilterConfig.domain (sluice: the env).
	Domain string
	// Settings are the matched action's RateLimitQuotaBucketSettings (Envoy
	// ignores its reporting_interval, and so does the client).
	Settings *rlqsfilterv3.RateLimitQuotaBucketSettings
	// ReportEvery is how often every bucket is reported (default EnvoyReportInterval,
	// what Envoy hard-codes; another value models a future Envoy that honours
	// reporting_interval).
	ReportEvery time.Duration
	// Metadata is sent with the stream (grpc_service initial_metadata).
	Metadata map[string]string
	// StartTimeout bounds opening a stream (Envoy's start does not block; a stream
	// that cannot be opened loses the reports sent on it).
	StartTimeout time.Duration
	// Loopback, when set, takes every report instead of a gRPC stream (in-process
	// simulations on a fake clock); it answers by calling Client.Apply, or not at all.
	Loopback func(*rlqsv3.RateLimitQuotaUsageReports)
}

// Client is one Envoy's filter state: the bucket cache and the stream.
type Client struct {
	cfg   Config
	conn  grpc.ClientConnInterface
	clock Clock

	mu      sync.Mutex
	buckets map[string]*cached
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel  context.CancelFunc
	sendMu  sync.Mutex
	closed  bool
	stopTk  func()
	stats   Stats
}

// Stats are the client's own counts.
type Stats struct {
	// ReportsSent and ReportsDropped count usage reports (a dropped one had no
	// stream to go on, its counts lost as Envoy loses them); Responses counts
	// responses applied.
	ReportsSent, ReportsDropped, Responses int
	// Replaced counts token buckets created afresh by an assignment, CarriedOver
	// those kept because the configuration was the same, Abandoned buckets erased.
	Replaced, CarriedOver, Abandoned int
	// Expired counts assignments whose TTL ran out, FallbackExpired fallbacks whose
	// timeout did.
	Expired, FallbackExpired int
	// StreamErr is how the last stream ended (nil while none has).
	StreamErr error
}

// cached is one bucket of the cache (Envoy's CachedBucket).
type cached struct {
	id      *rlqsv3.BucketId
	allowed uint64
	denied  uint64
	last    time.Duration
	action  *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction // nil: default
	limiter *tokenBucket
	stop    func() // the assignment's or fallback's expiry timer
	gen     int    // bumped on every change of action, so a stale timer does nothing
}

// New returns a client reporting over conn. It opens no stream until the first
// bucket is created.
func New(conn grpc.ClientConnInterface, clock Clock, cfg Config) *Client {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = time.Second
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = EnvoyReportInterval
	}
	return &Client{cfg: cfg, conn: conn, clock: clock, buckets: make(map[string]*cached)}
}

// Close stops the timers and closes the stream.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	if c.stopTk != nil {
		c.stopTk()
	}
	for _, b := range c.buckets {
		if b.stop != nil {
			b.stop()
		}
	}
	cancel := c.cancel
	c.stream, c.cancel = nil, nil
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// Stats returns a copy of the counts.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Disconnect ends the stream as a broken connection would; the next report
// opens a new one.
func (c *Client) Disconnect() {
	c.mu.Lock()
	cancel := c.cancel
	c.stream, c.cancel = nil, nil
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func key(m map[string]string) string {
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

// Decide decides one request of bucket id (the bucket_id_builder's result) and
// reports whether it is allowed, as the filter's decodeHeaders does.
func (c *Client) Decide(id map[string]string) bool {
	k := key(id)
	c.mu.Lock()
	b := c.buckets[k]
	if b != nil {
		ok := c.allow(b)
		if ok {
			b.allowed++
		} else {
			b.denied++
		}
		c.mu.Unlock()
		return ok
	}
	ok := noAssignmentAllows(c.cfg.Settings)
	b = &cached{id: &rlqsv3.BucketId{Bucket: maps(id)}, last: c.clock.Now()}
	if ok {
		b.allowed = 1
	} else {
		b.denied = 1
	}
	c.buckets[k] = b
	first := c.stopTk == nil
	if first {
		c.tickLocked()
	}
	report := c.reportLocked([]*cached{b})
	c.mu.Unlock()
	c.send(report, first)
	return ok
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// noAssignmentAllows is the first request's fate: only a blanket DENY_ALL denies.
func noAssignmentAllows(s *rlqsfilterv3.RateLimitQuotaBucketSettings) bool {
	f := s.GetNoAssignmentBehavior().GetFallbackRateLimit()
	return !(f.GetStrategy() != nil && f.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && isBlanket(f))
}

func isBlanket(s *typev3.RateLimitStrategy) bool {
	_, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok
}

// allow is shouldAllowRequest: the cached assignment, else the default action.
func (c *Client) allow(b *cached) bool {
	var s *typev3.RateLimitStrategy
	if b.action != nil {
		s = b.action.GetRateLimitStrategy()
	} else {
		s = c.cfg.Settings.GetNoAssignmentBehavior().GetFallbackRateLimit()
		if s == nil {
			return true // ALLOW_ALL when unset
		}
	}
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return st.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		if b.limiter == nil {
			// Envoy dereferences a null limiter here (a token bucket as
			// no_assignment_behavior): a crash. sluice never configures that.
			panic("rlqsclient: token bucket strategy without a limiter (Envoy would crash)")
		}
		return b.limiter.consume(c.clock.Now())
	}
	return true // requests_per_time_unit and unset strategies allow
}

// EnvoyReportInterval is how often Envoy's rate_limit_quota filter reports every
// bucket: 5 s, hard-coded (source/extensions/filters/http/rate_limit_quota/
// filter_persistence.cc), whatever the bucket settings' reporting_interval says.
const EnvoyReportInterval = 5 * time.Second

// tickLocked arms the report timer.
func (c *Client) tickLocked() {
	iv := c.cfg.ReportEvery
	c.stopTk = c.clock.AfterFunc(iv, func() {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		all := make([]*cached, 0, len(c.buckets))
		for _, b := range c.buckets {
			all = append(all, b)
		}
		report := c.reportLocked(all)
		c.tickLocked()
		c.mu.Unlock()
		c.send(report, true)
	})
}

// reportLocked builds a report of bs, resetting their counts.
func (c *Client) reportLocked(bs []*cached) *rlqsv3.RateLimitQuotaUsageReports {
	now := c.clock.Now()
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.cfg.Domain}
	for _, b := range bs {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           b.id,
			TimeElapsed:        &durationpb.Duration{Seconds: int64((now - b.last) / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.last = 0, 0, now
	}
	return r
}

// send sends a report on the open stream; start says whether to open one if there
// is none (the timer does, the immediate report of a new bucket does only for the
// first bucket). A report that cannot be sent is dropped, as Envoy drops it.
func (c *Client) send(r *rlqsv3.RateLimitQuotaUsageReports, start bool) {
	if len(r.BucketQuotaUsages) == 0 {
		return
	}
	if c.cfg.Loopback != nil {
		c.mu.Lock()
		c.stats.ReportsSent++
		c.mu.Unlock()
		c.cfg.Loopback(r)
		return
	}
	c.mu.Lock()
	st := c.stream
	c.mu.Unlock()
	if st == nil && start {
		st = c.open()
	}
	if st == nil {
		c.mu.Lock()
		c.stats.ReportsDropped++
		c.mu.Unlock()
		return
	}
	c.sendMu.Lock()
	err := st.Send(r)
	c.sendMu.Unlock()
	c.mu.Lock()
	if err != nil {
		c.stats.ReportsDropped++
		if c.stream == st {
			c.stream = nil
		}
	} else {
		c.stats.ReportsSent++
	}
	c.mu.Unlock()
}

// open starts a stream and its receiver; nil if it cannot be started.
func (c *Client) open() rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	if c.conn == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	if len(c.cfg.Metadata) > 0 {
		var kv []string
		for k, v := range c.cfg.Metadata {
			kv = append(kv, k, v)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	startCtx, done := context.WithTimeout(ctx, c.cfg.StartTimeout)
	type res struct {
		st  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
		err error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(c.conn).StreamRateLimitQuotas(ctx, grpc.WaitForReady(true))
		ch <- res{st, err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-startCtx.Done():
		r.err = startCtx.Err()
	}
	done()
	if r.err != nil {
		cancel()
		return nil
	}
	c.mu.Lock()
	if c.closed || c.stream != nil {
		c.mu.Unlock()
		cancel()
		return nil
	}
	c.stream, c.cancel = r.st, cancel
	c.mu.Unlock()
	go c.receive(r.st)
	return r.st
}

// receive applies responses until the stream ends (onRemoteClose: the stream is
// forgotten; the next report opens another).
func (c *Client) receive(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			c.mu.Lock()
			c.stats.StreamErr = err
			if c.stream == st {
				c.stream = nil
				c.cancel()
				c.cancel = nil
			}
			c.mu.Unlock()
			return
		}
		c.Apply(resp)
	}
}

// Apply applies a response as onQuotaResponseImpl does.
func (c *Client) Apply(resp *rlqsv3.RateLimitQuotaResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Responses++
	for _, a := range resp.BucketAction {
		if len(a.GetBucketId().GetBucket()) == 0 {
			continue
		}
		k := key(a.BucketId.Bucket)
		b := c.buckets[k]
		if b == nil {
			continue // not a bucket of ours
		}
		switch act := a.BucketAction.(type) {
		case *rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_:
			if b.stop != nil {
				b.stop()
			}
			delete(c.buckets, k)
			c.stats.Abandoned++
			continue
		case *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_:
			qa := act.QuotaAssignmentAction
			s := qa.GetRateLimitStrategy()
			var lim *tokenBucket
			switch s.GetStrategy().(type) {
			case *typev3.RateLimitStrategy_BlanketRule_:
			case *typev3.RateLimitStrategy_TokenBucket:
				if b.action != nil && b.action.GetRateLimitStrategy().GetTokenBucket() != nil && sameBucket(s.GetTokenBucket(), b.action.GetRateLimitStrategy().GetTokenBucket()) && b.limiter != nil {
					lim = b.limiter
					c.stats.CarriedOver++
				} else {
					lim = newTokenBucket(s.GetTokenBucket(), c.clock.Now())
					if b.limiter != nil {
						lim.fillLike(b.limiter, c.clock.Now())
					}
					c.stats.Replaced++
				}
			default:
				continue // requests_per_time_unit, or no strategy: ignored
			}
			if b.stop != nil {
				b.stop()
			}
			b.action = proto.Clone(qa).(*rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction)
			b.limiter = lim
			b.gen++
			c.expireAfter(b, k, time.Duration(qa.GetAssignmentTimeToLive().GetSeconds())*time.Second, false)
		}
	}
}

// sameBucket is Envoy's protoTokenBucketsEq: fill_interval's seconds are not compared.
func sameBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() && a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// expireAfter arms b's expiry timer: of its assignment (fallback false), then of
// the fallback.
func (c *Client) expireAfter(b *cached, k string, d time.Duration, fallback bool) {
	gen := b.gen
	b.stop = c.clock.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.buckets[k] != b || b.gen != gen {
			return
		}
		b.gen++
		eab := c.cfg.Settings.GetExpiredAssignmentBehavior()
		fb := eab.GetFallbackRateLimit()
		if fallback || fb == nil {
			if fallback {
				c.stats.FallbackExpired++
			} else {
				c.stats.Expired++
			}
			b.action, b.limiter, b.stop = nil, nil, nil // back to no_assignment_behavior
			return
		}
		c.stats.Expired++
		var lim *tokenBucket
		if tb := fb.GetTokenBucket(); tb != nil {
			if b.action != nil && b.action.GetRateLimitStrategy().GetTokenBucket() != nil && sameBucket(tb, b.action.GetRateLimitStrategy().GetTokenBucket()) && b.limiter != nil {
				lim = b.limiter
			} else {
				lim = newTokenBucket(tb, c.clock.Now())
			}
		}
		b.action = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{RateLimitStrategy: proto.Clone(fb).(*typev3.RateLimitStrategy)}
		b.limiter = lim
		c.expireAfter(b, k, time.Duration(eab.GetExpiredAssignmentBehaviorTimeout().GetSeconds())*time.Second, true)
	})
}

// tokenBucket is Envoy's AtomicTokenBucketImpl: tokens are (now − t)·rate, capped
// at max; a consume moves t forward by 1/rate.
type tokenBucket struct {
	max  float64
	rate float64 // tokens per second
	t    float64 // seconds
}

// minFillRate is Envoy's kMinFillRate: one token a year.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

func newTokenBucket(tb *typev3.TokenBucket, now time.Duration) *tokenBucket {
	sec := tb.GetFillInterval().GetSeconds() // whole seconds: nanos are truncated
	rate := math.Inf(1)
	if sec != 0 {
		rate = float64(tb.GetTokensPerFill().GetValue()) / float64(sec)
	}
	rate = math.Max(math.Abs(rate), minFillRate)
	b := &tokenBucket{max: float64(tb.GetMaxTokens()), rate: rate, t: now.Seconds()}
	if w := b.max / b.rate; w < b.t {
		b.t -= w // start full
	} // else Envoy's ENVOY_BUG branch: it starts empty
	return b
}

// fillLike starts b (just made, full or empty) with the share of its max_tokens
// that old holds at now, whole tokens rounded down: Envoy's
// createTokenBucketFromAction passes max_tokens × old.remainingTokens() /
// old.maxTokens() to the new AtomicTokenBucketImpl as its initial tokens.
func (b *tokenBucket) fillLike(old *tokenBucket, now time.Duration) {
	n := now.Seconds()
	remaining := 0.0
	if n > old.t {
		remaining = math.Min(old.max, (n-old.t)*old.rate)
	}
	initial := 0.0
	if old.max > 0 {
		initial = math.Floor(b.max * (remaining / old.max))
	}
	b.t = n
	if w := initial / b.rate; w < n {
		b.t = n - w
	}
}

func (b *tokenBucket) consume(now time.Duration) bool {
	n := now.Seconds()
	if n <= b.t {
		return false
	}
	total := math.Min(b.max, (n-b.t)*b.rate)
	if total < 1 {
		return false
	}
	b.t = n - (total-1)/b.rate
	return true
}
