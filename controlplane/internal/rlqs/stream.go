package rlqs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/shared/limit"
	sq "github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// newStream returns the state of a new stream of ledger owner owner: its ledger
// entries are named (quota.EntryName) under owner "rlqs:" and 16 random hex digits.
func (s *Server) newStream(owner string) *stream {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &stream{s: s, owner: owner, entry: quota.EntryName(owner, "rlqs:"+hex.EncodeToString(id[:])), buckets: make(map[bucketID]*bucket)}
}

// stream is one RLQS stream's state, used by its report loop and its follow-ups
// (Server.followUpLoop) under mu.
type stream struct {
	mu      sync.Mutex
	s       *Server
	owner   string
	entry   string // its ledger entries' name
	domain  string // the last report's
	buckets map[bucketID]*bucket
}

// bucketID names a bucket: the SHA-256 of its id's entries (canonical), so what a
// stream keeps per bucket is the same size however long the id's values are.
type bucketID [sha256.Size]byte

// canonical returns the name of a bucket id's map: the SHA-256 of its sorted
// name, value pairs, each NUL-terminated.
func canonical(m map[string]string) bucketID {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(m[k]))
		h.Write([]byte{0})
	}
	var id bucketID
	h.Sum(id[:0])
	return id
}

// track makes room for one more bucket of the stream, within the stream's, its
// identity's and the process's bounds; it returns which bound is full, "" when
// the bucket was counted.
func (ss *stream) track() string {
	s := ss.s
	if len(ss.buckets) >= s.o.MaxBucketsPerStream {
		return "stream"
	}
	s.bucketsMu.Lock()
	defer s.bucketsMu.Unlock()
	switch {
	case s.buckets >= s.o.MaxBuckets:
		return "process"
	case s.byOwner[ss.owner] >= s.o.MaxBucketsPerIdentity:
		return "identity"
	}
	s.buckets++
	s.byOwner[ss.owner]++
	s.m.buckets.Set(float64(s.buckets))
	return ""
}

// forget drops bucket id from the stream and its count.
func (ss *stream) forget(id bucketID) {
	if _, ok := ss.buckets[id]; !ok {
		return
	}
	delete(ss.buckets, id)
	ss.untrack(1)
}

func (ss *stream) untrack(n int) {
	s := ss.s
	s.bucketsMu.Lock()
	defer s.bucketsMu.Unlock()
	s.buckets -= n
	if s.byOwner[ss.owner] -= n; s.byOwner[ss.owner] <= 0 {
		delete(s.byOwner, ss.owner)
	}
	s.m.buckets.Set(float64(s.buckets))
}

// close releases the stream's buckets when it ends.
func (ss *stream) close() {
	ss.untrack(len(ss.buckets))
	ss.buckets = nil
}

// round is one report being answered: the response, the asks for the quota
// service, and what to record once the response is sent.
type round struct {
	ss     *stream
	domain string
	now    int64
	resp   *rlqsv3.RateLimitQuotaResponse
	after  []func(int64)
	asks   []quota.Assignment
	askFor []*bucket
	idFor  []*rlqsv3.BucketId
	// tooMany counts the buckets abandoned this round because a bound was full,
	// logged once per report.
	tooMany map[string]int
	// followUp is set for a round of follow-ups (no report).
	followUp bool
}

// abandonAction is an AbandonAction for bucket id: Envoy erases the bucket.
func abandonAction(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// abandon answers the bucket with an AbandonAction (Envoy forgets it) and drops
// it from the stream.
func (r *round) abandon(id *rlqsv3.BucketId, key bucketID, reason string) {
	r.ss.forget(key)
	r.resp.BucketAction = append(r.resp.BucketAction, abandonAction(id))
	r.ss.s.abandoned(reason, r.domain, id)
}

// handle answers one report; after holds what to record once the response is sent
// (called with the time after the send).
func (ss *stream) handle(ctx context.Context, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, []func(int64)) {
	ss.domain = msg.Domain
	r := &round{ss: ss, domain: msg.Domain, now: ss.s.o.Now(), resp: &rlqsv3.RateLimitQuotaResponse{}}
	seen := make(map[bucketID]struct{}, len(msg.BucketQuotaUsages))
	for _, u := range msg.BucketQuotaUsages {
		entries := u.GetBucketId().GetBucket()
		if len(entries) == 0 || u.GetBucketId().ValidateAll() != nil {
			ss.s.m.invalid.Inc()
			continue // no entries, or an empty name or value: no valid answer can name it
		}
		key := canonical(entries)
		if _, dup := seen[key]; dup {
			ss.s.m.invalid.Inc()
			continue // one answer per bucket: a repeat in the same report is ignored
		}
		seen[key] = struct{}{}
		r.usage(u, key)
	}
	if len(r.tooMany) > 0 {
		ss.s.warn("too_many_buckets", "rlqs: buckets abandoned: a bound on tracked buckets is full",
			"domain", msg.Domain, "by_bound", r.tooMany, "stream_buckets", len(ss.buckets))
	}
	if len(r.asks) > 0 {
		r.apply(ctx)
	}
	return r.resp, r.after
}

// usage takes one bucket's usage: it resolves the bucket to a fleet rule and a
// counter key (or abandons it), accounts the report, and queues an ask when
// there is something to grant, return, charge or record.
func (r *round) usage(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, key bucketID) {
	ss, s := r.ss, r.ss.s
	b := ss.buckets[key]
	fr, req, reason := r.resolve(u.GetBucketId().GetBucket())
	if reason != "" {
		r.abandon(u.BucketId, key, reason)
		return
	}
	if fr.Exempt(&req) {
		ss.forget(key)
		r.resp.BucketAction = append(r.resp.BucketAction, blanket(u.BucketId, typev3.RateLimitStrategy_ALLOW_ALL, ss.ttlFor(nil)))
		s.m.actions.WithLabelValues("allow_all").Inc()
		return
	}
	ckey, ok := fr.Key(&req)
	if !ok {
		r.abandon(u.BucketId, key, ReasonMissingKeyPart)
		return
	}
	if b == nil {
		if full := ss.track(); full != "" {
			if r.tooMany == nil {
				r.tooMany = map[string]int{}
			}
			r.tooMany[full]++
			r.resp.BucketAction = append(r.resp.BucketAction, abandonAction(u.BucketId))
			s.m.abandoned.WithLabelValues(ReasonTooManyBuckets).Inc()
			s.m.actions.WithLabelValues("abandon").Inc()
			return
		}
	}
	if b == nil || b.key != ckey || b.rule.Rule.Fingerprint != fr.Rule.Fingerprint {
		// A new counter (first report, or a rule whose counters restarted): units of
		// the old one are forfeited, never returned into the new one.
		b = &bucket{key: ckey, nanos: mrand.Int32N(999999999) + 1}
		ss.buckets[key] = b
	}
	b.rule = fr
	r.account(u, key, b)
}

// resolve finds the fleet rule a bucket id names and the request its key-part
// entries describe, or the reason to abandon it.
func (r *round) resolve(entries map[string]string) (*quota.FleetRule, rules.Request, string) {
	s := r.ss.s
	policy, rule := entries[EntryPolicy], entries[EntryRule]
	if policy == "" || rule == "" {
		return nil, rules.Request{}, ReasonNoPolicyEntry
	}
	fr, reason := s.o.Quota.Resolve(policy, r.domain, rule)
	switch {
	case fr == nil:
		return nil, rules.Request{}, reason
	case fr.Rule.Rule.CostHeader != "" || fr.Rule.Rule.Cost > 1:
		return nil, rules.Request{}, ReasonCost
	case fr.MaxLease() < time.Second+s.o.Margin:
		return nil, rules.Request{}, ReasonLeaseTooShort
	}
	req, reason := request(entries, fr.Rule.Rule.Key)
	return fr, req, reason
}

// account takes a bucket's report: the counts, clamped to what it could have
// admitted, its demand and report interval, and queues the ask they call for.
func (r *round) account(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, key bucketID, b *bucket) {
	s, fr, now := r.ss.s, b.rule, r.now
	// Counts are the client's: bounded as the quota protocol bounds units, so no
	// sum below can wrap.
	allowed, denied := min(u.NumRequestsAllowed, sq.MaxUnits), min(u.NumRequestsDenied, sq.MaxUnits)
	if most := b.admittable(now, fr.Rule.Config, fr.Rule.Rule.QuotaFailure() != rules.QuotaFailureDeny, s.o.Margin); allowed > most {
		allowed = most
		s.m.clamped.Inc()
		s.warn("clamped", "rlqs: a report counted more requests allowed than the bucket could admit; clamped", "domain", r.domain, "reported", u.NumRequestsAllowed, "clamped_to", most)
	}
	b.report(now, allowed, s.o.Margin)
	b.paceReport(allowed+denied, now)
	switch {
	case allowed+denied > 0 || b.lastDemand == 0:
		b.lastDemand = now
	case now-b.lastDemand >= int64(s.o.IdleAfter):
		r.abandon(u.BucketId, key, ReasonIdle)
		return
	}
	interval := b.observe(now)
	b.due = 0 // this report's answer schedules the next follow-up, if any
	b.id = nil
	if idBytes(u.BucketId) <= maxFollowUpID {
		b.id = u.BucketId
	}
	var want uint64
	if d := allowed + denied; d > 0 {
		// What the last report interval asked for (denied requests are demand too)
		// and one more, and what the refill of the assignment's TTL reserves on top.
		// No more headroom: a grant replaces the last, so what an Envoy leaves
		// unspent is lost to the fleet until it settles, two reports later.
		need := d + 1
		want = need + need*uint64(ttlSeconds(interval)+1)/uint64(refillPeriod/time.Second)
	}
	b.want = want
	ret := b.toReturn()
	var charge uint64
	if fr.Rule.Rule.QuotaFailure() != rules.QuotaFailureDeny {
		charge = b.toCharge()
	}
	if want == 0 && ret == 0 && charge == 0 && b.unrecordedUsed == 0 {
		return
	}
	r.ask(b, u.BucketId, quota.Assignment{Return: ret, Charge: charge, Want: want, Interval: interval, Keep: b.keep(now)})
}

// ask queues the quota service ask a for bucket b (whose id is id), the fields
// every ask of the bucket shares filled in.
func (r *round) ask(b *bucket, id *rlqsv3.BucketId, a quota.Assignment) {
	ss := r.ss
	a.Rule, a.Key, a.Entry, a.Owner, a.Used = b.rule, b.key, ss.entry, ss.owner, b.unrecordedUsed
	a.MinLife = time.Second + ss.s.o.Margin
	a.Fit = func(units uint64, life time.Duration) uint64 {
		ttl := ss.grantTTL(b, life)
		if ttl < time.Second {
			return 0
		}
		m := tokensFor(units, ttl)
		if rest := life - ss.s.o.Margin; b.pace > 0 && rest-ttl < time.Second && rest >= b.interval {
			// The bucket's last grant before the lease ends (its TTL runs to the
			// end, short of it by what Envoy's whole seconds cannot reach), made
			// while others still report in the lease: no more tokens than the
			// requests its TTL will see at the bucket's pace, so that what it could
			// not spend stays with the key for them.
			m = min(m, max(1, uint64(ttl/b.pace)))
		}
		if b.pace > 0 && paced(b.rule) && ss.followed(b, ttl) {
			// A token bucket followed up before it ends: no more tokens than the
			// requests until then and one, so that what the follow-up replaces
			// unspent, which comes back only once it settles, stays small.
			m = min(m, 1+uint64(ss.followAfter(ttl)/b.pace))
		}
		return reserved(m, uint64((ttl+time.Second)/time.Second), uint64(refillPeriod/time.Second))
	}
	r.asks = append(r.asks, a)
	r.askFor = append(r.askFor, b)
	r.idFor = append(r.idFor, id)
}

// apply asks the quota service for the round's asks at once and turns each
// result into the bucket's action: a fresh token bucket, DENY_ALL, or none.
func (r *round) apply(ctx context.Context) {
	ss, s, now := r.ss, r.ss.s, r.now
	results, err := s.o.Quota.Assign(ctx, r.asks)
	if err != nil {
		// Nothing was recorded: every bucket keeps its assignment until its TTL, then
		// falls back as its settings say; the use is reported again next time.
		s.m.unavailable.Inc()
		s.warn("unavailable", "rlqs: quota store unavailable; buckets keep their assignments until they expire", "err", err)
		return
	}
	for i, res := range results {
		b, a := r.askFor[i], &r.asks[i]
		if res.Status == sq.StatusRetry {
			s.m.actions.WithLabelValues("none").Inc()
			continue // contended: nothing recorded, the same report goes again next time
		}
		b.unrecordedUsed = 0
		b.returned += a.Return
		b.owed -= min(b.owed, a.Charge)
		s.m.charged.Add(float64(a.Charge))
		if res.Tag != b.tag {
			b.newEpoch(res.Tag)
		}
		if res.Granted > 0 {
			ttl := ss.grantTTL(b, time.Duration(res.End-res.Now))
			tokens := uint64(0)
			if ttl >= time.Second {
				tokens = tokensFor(res.Granted, ttl)
			}
			if tokens == 0 {
				// Too late or too little to use: the units settle and return.
				b.pending = append(b.pending, sent{units: res.Granted, at: now})
				s.m.actions.WithLabelValues("none").Inc()
				continue
			}
			b.nanos = b.nanos%999999999 + 1 // a configuration Envoy has not got: a fresh bucket
			r.resp.BucketAction = append(r.resp.BucketAction, fresh(r.idFor[i], tokens, b.nanos, ttl)...)
			s.m.actions.WithLabelValues("token_bucket").Inc()
			units, bb := res.Granted, b
			r.after = append(r.after, func(at int64) {
				bb.pending = append(bb.pending, sent{units: units, at: at, ttl: int64(ttl)})
				bb.credits = append(bb.credits, credit{units: units, left: units, held: units, at: at, ttl: int64(ttl)})
				bb.tbUntil = at + int64(ttl)
				ss.followLive(bb, at, 0)
			})
			continue
		}
		if a.Want == 0 {
			continue // a report only
		}
		ss.followLive(b, now, res.RetryAfter)
		if b.tbUntil > now && (r.followUp || b.due != 0) {
			// Nothing granted now, more later: the live token bucket is left alone
			// (its units were paid for) until the follow-up.
			s.m.actions.WithLabelValues("none").Inc()
			continue
		}
		if a.Keep > 0 {
			// Its live token bucket still holds units: a grant no larger would only
			// have replaced it, and a denial would void units it was granted.
			s.m.actions.WithLabelValues("none").Inc()
			continue
		}
		// Nothing granted: the budget is spent, or the lease ends too soon. A token
		// bucket that lives past the next report is still good to spend; otherwise
		// DENY_ALL until more may be granted.
		if b.tbUntil > now+int64(ss.ttlFor(b)) {
			s.m.actions.WithLabelValues("none").Inc()
			continue
		}
		ttl := max(res.RetryAfter, ss.ttlFor(b))
		ttl = min((ttl + time.Second - 1).Truncate(time.Second), time.Hour)
		r.resp.BucketAction = append(r.resp.BucketAction, blanket(r.idFor[i], typev3.RateLimitStrategy_DENY_ALL, ttl))
		s.m.actions.WithLabelValues("deny_all").Inc()
		bb := b
		r.after = append(r.after, func(at int64) {
			bb.pending = append(bb.pending, sent{at: at, ttl: int64(ttl)})
			bb.credits = append(bb.credits, credit{at: at, ttl: int64(ttl)})
			bb.tbUntil = 0
		})
	}
}

// maxFollowUpID is the largest bucket id (its names' and values' bytes) a stream
// keeps to follow its bucket up; a bucket of a larger id is answered only when
// it reports, so what a stream keeps per bucket stays bounded whatever its ids.
const maxFollowUpID = 1024

// idBytes is the bytes of id's names and values.
func idBytes(id *rlqsv3.BucketId) int {
	n := 0
	for k, v := range id.GetBucket() {
		n += len(k) + len(v)
	}
	return n
}

// paced reports whether fr's keys are the buckets (token_bucket, gcra), whose
// leases follow one another at any time, rather than windows or slots.
func paced(fr *quota.FleetRule) bool {
	switch fr.Rule.Config.Algorithm {
	case limit.TokenBucket, limit.GCRA:
		return true
	}
	return false
}

// followed reports whether a token bucket of ttl sent to b now dies before the
// next report is answered (a TTL shorter than ttlFor's), so that b is followed
// up: while its requests keep coming, the server pushes the next assignment
// before the Envoy falls back to its expired behaviour. Envoy applies an
// assignment whenever one arrives, asked for or not (global_client_impl.cc,
// GlobalRateLimitClientImpl::onReceiveMessage; the filter's documentation,
// rate_limit_quota_filter.rst: the server "proactively pushes" them).
func (ss *stream) followed(b *bucket, ttl time.Duration) bool {
	return b.id != nil && b.interval > 0 && ttl < ss.ttlFor(b)
}

// followAfter is how long after it is sent a token bucket of ttl of the buckets
// is followed up: half its life, and early enough for the follow-up's answer to
// reach the Envoy before it ends (twice the margin: the round, the way there).
func (ss *stream) followAfter(ttl time.Duration) time.Duration {
	return min(ttl-2*ss.s.o.Margin, ttl/2)
}

// followLive schedules b's follow-up after an answer at now (retry: how long
// until the key may grant more, 0 if unknown). While its last token bucket lives
// and dies before the next report: at its end for a window's (the window's next
// units come then); for the buckets followAfter its start, or once its units
// should be spent at the bucket's pace, or when the key has more for one that
// is spent, but never sooner than followUpEvery. When none lives: once the key
// has more (retryFollowUp).
func (ss *stream) followLive(b *bucket, now int64, retry time.Duration) {
	if len(b.credits) > 0 && b.tbUntil > now {
		c := b.credits[len(b.credits)-1]
		if !ss.followed(b, time.Duration(c.ttl)) {
			return
		}
		if !paced(b.rule) {
			ss.followAt(b, b.tbUntil)
			return
		}
		t := c.at + int64(ss.followAfter(time.Duration(c.ttl)))
		switch kept := b.keep(now); {
		case kept > 0 && b.pace > 0:
			t = min(t, c.at+int64(b.pace)*int64(min(c.units, 1<<20)))
		case kept == 0 && retry > 0:
			t = min(t, now+int64(ss.retryFollowUp(b, retry)))
		}
		ss.followAt(b, max(t, now+int64(followUpEvery)))
		return
	}
	if retry > 0 {
		ss.followAt(b, now+int64(ss.retryFollowUp(b, retry)))
	}
}

// followUpEvery is the shortest time between two follow-ups of a token bucket
// (a store round each): the key refills meanwhile, and the next grant is that
// much larger.
const followUpEvery = 500 * time.Millisecond

// retryFollowUp is how long after an answer that granted less than asked the
// bucket is followed up again: when the key may grant more (retry), but no
// sooner than its next request is due (its pace, at most a second) nor
// followUpTick, so that many Envoys waiting on one key do not all ask at every
// unit it refills; for the buckets, not sooner than followUpEvery.
func (ss *stream) retryFollowUp(b *bucket, retry time.Duration) time.Duration {
	least := followUpTick
	if paced(b.rule) {
		least = followUpEvery
	}
	return max(retry, least, min(b.pace, time.Second))
}

// followAt schedules b's next follow-up at t (Unix ns), unless b cannot be
// followed up or its next report, which answers it anyway, comes first: for a
// window's, unless it comes at least half a report interval or a quarter of
// the window later, whichever is less, as a grant it replaces that soon would
// leave units that settle, and return, only in a later window. (With half the
// window, Envoys reporting halfway through a 5 s window were never followed up
// at its turn, and spent half of every window without an assignment: 40 of 50
// in the real Envoy.)
func (ss *stream) followAt(b *bucket, t int64) {
	before := ss.s.o.Margin
	if !paced(b.rule) {
		before = max(before, min(b.interval/2, b.rule.MaxLease()/4))
	}
	if b.id == nil || b.interval <= 0 || t+int64(before) >= b.lastReport+int64(b.interval) {
		return
	}
	if b.due == 0 || t < b.due {
		b.due = t
	}
}

// nextFollowUp is when the stream's earliest follow-up is due (Unix ns), 0 if none.
func (ss *stream) nextFollowUp() int64 {
	var next int64
	for _, b := range ss.buckets {
		if b.due > 0 && (next == 0 || b.due < next) {
			next = b.due
		}
	}
	return next
}

// followUps answers, without a report, the buckets whose follow-up is due at
// the service clock's now, as account would a report of nothing: what the
// bucket's last report asked for, its returns and charges. A bucket whose last
// report had no request is left to its next report.
func (ss *stream) followUps(ctx context.Context) (*rlqsv3.RateLimitQuotaResponse, []func(int64)) {
	r := &round{ss: ss, domain: ss.domain, now: ss.s.o.Now(), resp: &rlqsv3.RateLimitQuotaResponse{}, followUp: true}
	for _, b := range ss.buckets {
		if b.due == 0 || b.due > r.now {
			continue
		}
		b.due = 0
		if b.id == nil || b.want == 0 || b.lastDemand != b.lastReport {
			continue
		}
		if fr, _, reason := r.resolve(b.id.GetBucket()); reason != "" || fr.Rule.Fingerprint != b.rule.Rule.Fingerprint {
			continue // the policy changed since the report: its next report decides
		}
		var charge uint64
		if b.rule.Rule.Rule.QuotaFailure() != rules.QuotaFailureDeny {
			charge = b.toCharge()
		}
		r.ask(b, b.id, quota.Assignment{Return: b.toReturn(), Charge: charge, Want: b.want, Interval: b.interval, Keep: b.keep(r.now)})
		ss.s.m.followUps.Inc()
	}
	if len(r.asks) > 0 {
		r.apply(ctx)
	}
	return r.resp, r.after
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

// maxGrantTTL is the longest TTL of a token bucket assignment: under half the
// refillPeriod, so that a bucket of a token or two refills no whole token over its
// life and its units cover no refill (reserved).
const maxGrantTTL = 28 * time.Second

// grantTTL is the TTL of a token bucket assignment of a lease with life left, in
// whole seconds as Envoy counts them, ending the margin before the lease does: the
// time of about two of the bucket's requests at its rate, at least ttlFor (past
// the next report, which replaces a bucket with demand anyway) and at most
// maxGrantTTL. An Envoy that reports every 5 s and sends a request every 10 s must
// still find its token when the request comes, not its expired behaviour (a
// denial); a busier bucket keeps a short life, so that the refill its units must
// cover stays small and what it leaves unspent comes back soon.
func (ss *stream) grantTTL(b *bucket, life time.Duration) time.Duration {
	next := ss.ttlFor(b)
	ttl := max(next, min(maxGrantTTL, 2*b.pace))
	if rest := life - ss.s.o.Margin; rest-ttl < next {
		// No grant after the next report could outlive this one by a report: the
		// next report would find units left in it and leave them (Keep) to die at
		// its TTL. Let it live to the lease's end instead.
		ttl = min(rest, maxGrantTTL)
	}
	return min(life-ss.s.o.Margin, ttl).Truncate(time.Second)
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

// fresh is the actions that give bucket id a fresh token bucket of tokens, full:
// a DENY_ALL, then the token bucket. Envoy starts a token bucket that replaces
// another only as full as the old one still is (createTokenBucketFromAction,
// since envoyproxy/envoy#37624), so a grant after a spent one would start empty;
// after a blanket rule there is no old one. Envoy applies a response's actions
// in order and publishes the buckets to its workers once, after the last
// (onQuotaResponseImpl), so no request ever meets the DENY_ALL.
func fresh(id *rlqsv3.BucketId, tokens uint64, nanos int32, ttl time.Duration) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	return []*rlqsv3.RateLimitQuotaResponse_BucketAction{blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl), tokenBucket(id, tokens, nanos, ttl)}
}

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
