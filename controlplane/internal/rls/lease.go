package rls

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/shared/limit"
	sq "github.com/sluice-proxy/sluice/shared/quota"
)

// A replica decides descriptors from leases it holds on their fleet keys, as an
// Envoy's Wasm filter does: units taken from the fleet budget by the quota
// service's rounds (quota.Service.Assign), spent one decision at a time without
// a store round trip, asked for again when they run low. docs/rls.md, "Leases".

// Sizing of a replica's asks.
const (
	// askHorizon is how much of a key's observed demand one ask wants: the
	// units its decisions took over this long (a window's rest when shorter),
	// with a quarter more, or twice that many far from the limit
	// (farFromLimit; the ledger caps it at the replica's share of the
	// budget).
	askHorizon = time.Second
	// minDemandSpan is the shortest time a demand estimate divides by: units
	// taken faster than that count as taken over it (a burst of a few calls
	// right after a grant asks for a few times them, growing ask by ask while
	// the demand lasts).
	minDemandSpan = askHorizon / 4
	// farFromLimit: a key whose budget beyond every lease was at least this
	// many times a replica's demand over askHorizon at its last ask is far
	// from its limit, and the replica asks for twice its demand instead of
	// a quarter more.
	farFromLimit = 16
	// refillBelow is the fraction (1/refillBelow) of the last grant left at
	// which an ask for more starts in the background, so that a steadily used
	// key is seldom decided behind a store round trip.
	refillBelow = 4
	// askInterval is the report interval the replica's ledger entries are
	// sized and remembered for.
	askInterval = time.Second
	// failureHold is how long after a failed ask a key is decided by its
	// on_quota_failure without asking again.
	failureHold = time.Second
	// idleAfter is how long a lease may go unused before the sweep returns its
	// units and forgets it: a replica whose demand on a key stopped gives what
	// it holds back to the key's other holders within this and the sweep's
	// second.
	idleAfter = 2 * time.Second
	// maxAttempts bounds the asks and waits of one decision whose units the
	// key's other decisions keep taking first; a refusal by the quota service
	// ends it sooner.
	maxAttempts = 32
	// perCallUnits is each key's last units of budget (quota.Assignment.Reserve),
	// granted a call at a time: once a key has no more left beyond every
	// lease, a replica holds none it has not spent, so a replica killed then
	// strands none and every unit reaches a caller. A key of at most this
	// limit is decided a call at a time throughout (at most this many store
	// rounds a window for its admitted calls).
	perCallUnits = 128
	// heldPoll is how often a call whose units other holders' leases hold
	// asks again (heldElsewhere), and maxHeldWait the longest it waits for
	// them, or three quarters of the time its deadline leaves, whichever is
	// less (the answer must reach Envoy within its ratelimit filter's
	// timeout, or Envoy decides by failure_mode_deny instead).
	heldPoll    = 3 * time.Millisecond
	maxHeldWait = 100 * time.Millisecond
	// heldGiveUp bounds how long after a call waited in vain the key's calls
	// short of units are refused without asking or waiting (a holder that
	// died keeps its units counted until its lease ends): until the budget
	// may have more (the answer's RetryAfter, a fixed window's end when it is
	// spent), at most this.
	heldGiveUp = time.Second
)

// lease is the replica's holding on one fleet key.
type lease struct {
	mu sync.Mutex
	// rule is the rule the units were granted under, fp its fingerprint; a
	// changed rule's units are dropped.
	rule *quota.FleetRule
	fp   uint64
	// units left to admit, until end (service clock, Unix ns), counted in
	// window or slot tag.
	units, last uint64
	end         int64
	tag         uint64
	// used is units admitted since the last ask, reported by the next one;
	// stale units granted under an earlier fingerprint of the key's rule (a
	// limit override of another limit on the same counter), or recalled by
	// another replica (recall), returned by it;
	// charge units admitted by on_quota_failure while the quota service
	// could not decide, booked by it as a charge (taken from the budget even
	// past the limit, as the Wasm filter's degraded decisions are).
	used, stale, charge uint64
	// askedAt is when the last ask was sent (for the demand estimate).
	askedAt int64
	// left is the key's units left beyond every lease at the last ask;
	// exact: they were perCallUnits or fewer, so asks want only what calls
	// need (the quota service grants no more) and no refill is started.
	left  uint64
	exact bool
	// waiting is the hits of the decisions that lack units, asking or
	// waiting for an ask: the next ask needs them all.
	waiting uint64
	// refused: no ask for refusedNeed or more units before this (the budget
	// beyond every lease had fewer); failed: the last ask failed, decide by
	// on_quota_failure until this.
	refused, failed int64
	refusedNeed     uint64
	// heldElsewhere: the last ask lacked units that other holders' leases
	// hold (quota.AssignResult.HeldElsewhere); the calls short of units ask
	// again every heldPoll until they return or spend them, or until
	// heldRetry (service clock: when the budget may have more without them,
	// at most heldGiveUp after that answer; a fixed window's end at the
	// latest).
	heldElsewhere uint64
	heldRetry     int64
	// lastUse is when a decision last took units.
	lastUse int64
	// asking is closed when the ask in flight ends; nil when none is.
	asking chan struct{}
	// gone: the sweep forgot the lease and gave its units back; a decision
	// holding it looks the key up again.
	gone bool
	// once: a lease of one decision, not kept (the replica holds its bound of
	// leases): it asks for exactly what the decision needs and never refills.
	once bool
}

// outcome is one descriptor's decision.
type outcome struct {
	admitted bool
	// failed: the quota service could not decide (the rule's on_quota_failure
	// decided instead).
	failed bool
	// remaining is units left for the key (limit_remaining), reset how long
	// until the limit is whole again (duration_until_reset).
	remaining uint64
	reset     time.Duration
}

// leases is the replica's leases by counter key.
type leases struct {
	mu  sync.Mutex
	m   map[string]*lease
	max int
}

// get returns the lease of key, adding it; nil when max leases are held and
// key is not one of them.
func (ls *leases) get(key string) *lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.m[key]
	if l == nil {
		if len(ls.m) >= ls.max {
			return nil
		}
		l = &lease{}
		ls.m[key] = l
	}
	return l
}

// leaseOf returns the lease of key; past the bound of leases, one of a single
// decision, decided by an ask of its own and not kept.
func (s *Server) leaseOf(key string) *lease {
	if l := s.leases.get(key); l != nil {
		return l
	}
	s.m.leasesFull.Inc()
	return &lease{once: true}
}

// take decides hits units of key under fr at the service clock: from the
// lease while it holds enough, else after an ask.
func (s *Server) take(ctx context.Context, fr *quota.FleetRule, key string, hits uint64) (o outcome) {
	l := s.leaseOf(key)
	cfg := fr.Rule.Config
	// waits: hits are counted in l.waiting (the call lacks units; the asks
	// made meanwhile need them), until the call takes them or ends.
	waits := false
	// held: when the call began waiting for units other leases hold (real
	// time, as its deadline); polled: it waited since its last ask, polls times.
	var held time.Time
	polled, polls := false, 0
	defer func() {
		if !held.IsZero() {
			s.m.heldWaits.WithLabelValues(codeName(o.admitted)).Inc()
		}
		if waits {
			l.mu.Lock()
			l.waiting -= hits
			l.mu.Unlock()
		}
	}()
	for attempt := 0; ; attempt++ {
		now := s.o.Now()
		l.mu.Lock()
		if l.gone {
			l.unwait(&waits, hits)
			l.mu.Unlock()
			l = s.leaseOf(key)
			continue
		}
		l.expire(fr, now)
		if hits == 0 && (l.askedAt != 0 || attempt > 0 || now < l.failed) {
			// A check: what is left, nothing taken. A key never asked for
			// asks first, to know what the budget has left.
			o = l.report(cfg, now, true)
			l.mu.Unlock()
			return o
		}
		if hits > 0 && l.units >= hits {
			l.unwait(&waits, hits)
			return s.spend(fr, key, l, hits, now)
		}
		switch {
		case hits > cfg.Limit+cfg.Burst:
			// More than the key can ever hold at once: never admitted.
			o = l.report(cfg, now, false)
			l.mu.Unlock()
			return o
		case now < l.failed:
			l.mu.Unlock()
			o = s.onFailure(fr, key, hits, now)
			if o.admitted && !l.once {
				l.mu.Lock()
				l.charge += hits
				l.mu.Unlock()
			}
			return o
		case now < l.refused && hits-min(hits, l.units) >= l.refusedNeed || attempt-polls >= maxAttempts:
			// The budget beyond every lease lacked what this call needs at
			// the last ask (or the key is that contended): refused. Units
			// that others took meanwhile are no reason: ask again.
			o = l.report(cfg, now, false)
			l.mu.Unlock()
			return o
		}
		if !waits {
			l.waiting += hits
			waits = true
		}
		if l.heldElsewhere > 0 && !polled && attempt > 0 {
			// What this call lacks is in other holders' leases: wait for them
			// to spend or return it, then ask again.
			if o, refused := l.waitHeld(ctx, cfg, now, &held); refused {
				return o
			}
			polled = true
			polls++
			continue
		}
		polled = false
		ch := l.asking
		if ch == nil {
			ch = make(chan struct{})
			l.asking = ch
			l.mu.Unlock()
			// Not the caller's cancellation: a call Envoy gave up on must not
			// fail the ask the key's other decisions wait for (the quota
			// service's own timeout bounds it).
			s.ask(context.WithoutCancel(ctx), fr, key, l, hits)
		} else {
			l.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return outcome{failed: true}
			}
		}
	}
}

// unwait takes a call's hits out of l.waiting if it waits (*waits), and
// records that it no longer does. The caller holds l.mu.
func (l *lease) unwait(waits *bool, hits uint64) {
	if *waits {
		l.waiting -= hits
		*waits = false
	}
}

// waitHeld waits heldPoll (awaitHeld) for a call at now that lacks units
// other holders' leases hold, and returns refused with its answer once it
// waited in vain: the key's calls short of units are then refused without
// asking until heldRetry. The caller holds l.mu, which waitHeld releases.
func (l *lease) waitHeld(ctx context.Context, cfg limit.Config, now int64, held *time.Time) (o outcome, refused bool) {
	retry := l.heldRetry
	l.mu.Unlock()
	if awaitHeld(ctx, held, time.Duration(retry-now)) {
		return outcome{}, false
	}
	l.mu.Lock()
	l.refused, l.refusedNeed, l.heldElsewhere = retry, 1, 0
	o = l.report(cfg, now, false)
	l.mu.Unlock()
	return o, true
}

// awaitHeld waits heldPoll for a call that lacks units other holders' leases
// hold, and reports whether it may ask again: false once the call has waited
// since *since (set at its first wait) as long as maxHeldWait or three
// quarters of what ctx's deadline left it then, when the wait would not end
// before left (the time until the lease's heldRetry: a call admitted in the
// next window would count, in Envoy's access log, in the window it arrived
// in), or when ctx ended.
func awaitHeld(ctx context.Context, since *time.Time, left time.Duration) bool {
	now := time.Now()
	if since.IsZero() {
		*since = now
	}
	budget := maxHeldWait
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, dl.Sub(*since)*3/4)
	}
	if now.Add(heldPoll).Sub(*since) > budget || 2*heldPoll >= left {
		return false
	}
	t := time.NewTimer(heldPoll)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// spend takes hits units from l's lease at now and answers the call admitted,
// starting a refill in the background when the lease runs low (refillBelow,
// short) and the key is not down to its last units (exact). The caller holds
// l.mu, which spend releases.
func (s *Server) spend(fr *quota.FleetRule, key string, l *lease, hits uint64, now int64) outcome {
	l.units -= hits
	l.used += hits
	l.lastUse = now
	o := l.report(fr.Rule.Config, now, true)
	refill := !l.once && !l.exact && l.asking == nil && l.units*refillBelow < l.last && l.short(now)
	if refill {
		l.asking = make(chan struct{})
	}
	l.mu.Unlock()
	if refill {
		s.refill(refillJob{fr: fr, key: key, l: l})
	}
	return o
}

// short reports whether the lease's units will run out well before it ends
// (at four fifths of what the rate its decisions took them at since the last
// ask needs: the grant's headroom, inverted). The caller holds l.mu.
func (l *lease) short(now int64) bool {
	elapsed := now - l.askedAt
	if elapsed <= 0 || l.end <= now {
		return true
	}
	return float64(l.units)*1.25 < float64(l.used)*float64(l.end-now)/float64(elapsed)
}

// refillJob is a background ask for more units of a key.
type refillJob struct {
	fr  *quota.FleetRule
	key string
	l   *lease
}

// refill hands j to the refill workers (Run), or to a goroutine of its own
// when they are all busy: a refill never waits, and the workers' grown stacks
// spare most refills a new goroutine's.
func (s *Server) refill(j refillJob) {
	if s.o.InlineRefills {
		s.ask(context.Background(), j.fr, j.key, j.l, 0)
		return
	}
	if s.workers.Load() > 0 {
		select {
		case s.refills <- j:
			return
		default:
		}
	}
	go s.ask(context.Background(), j.fr, j.key, j.l, 0)
}

// refillWorker runs refills until ctx ends.
func (s *Server) refillWorker(ctx context.Context) {
	s.workers.Add(1)
	defer s.workers.Add(-1)
	for {
		select {
		case <-ctx.Done():
			// Refills handed over meanwhile still end (their waiters with them).
			for {
				select {
				case j := <-s.refills:
					s.ask(context.Background(), j.fr, j.key, j.l, 0)
				default:
					return
				}
			}
		case j := <-s.refills:
			s.ask(ctx, j.fr, j.key, j.l, 0)
		}
	}
}

// expire drops units that can no longer be spent: the lease ended, or the
// rule changed. The caller holds l.mu.
func (l *lease) expire(fr *quota.FleetRule, now int64) {
	if l.rule == nil || l.fp != fr.Rule.Fingerprint {
		if l.units > 0 && now < l.end {
			l.stale += l.units // still the key's: back to its budget
		}
		l.fp = fr.Rule.Fingerprint
		l.units, l.last, l.end, l.tag, l.used, l.askedAt, l.left, l.refused, l.failed = 0, 0, 0, 0, 0, 0, 0, 0, 0
		l.exact = false
	}
	l.rule = fr
	if l.units > 0 && now >= l.end {
		l.units = 0
	}
}

// report is the outcome of a decision at now: admitted, with what the key has
// left (the leases' units beyond this lease are not counted: to the replica
// they are spent); refused, with nothing left (as envoyproxy/ratelimit
// answers OVER_LIMIT). The caller holds l.mu.
func (l *lease) report(cfg limit.Config, now int64, admitted bool) outcome {
	o := outcome{admitted: admitted}
	if admitted {
		o.remaining = min(l.units+l.left, cfg.Limit)
	}
	switch cfg.Algorithm {
	case limit.FixedWindow, limit.TimeWheel:
		if l.end > now {
			o.reset = time.Duration(l.end - now)
		} else {
			o.reset = cfg.Window - time.Duration(now%int64(cfg.Window))
		}
	default:
		// A bucket is whole again once what it lacks has refilled.
		missing := cfg.Limit - o.remaining
		o.reset = time.Duration(float64(cfg.Window) * float64(missing) / float64(cfg.Limit))
	}
	return o
}

// ask asks the quota service for units of key: at least need (0: a refill in
// the background) and what the decisions waiting for it need, as many as the
// key's decisions took over askHorizon (only those when the key is down to its
// perCallUnits), and whatever the share, what these lack of the lease's units
// when the budget beyond every lease has it (Assignment.Need). It
// reports what the lease used since the last ask, returns the units of an ended
// lease, and records the answer. The caller set l.asking; ask closes it.
func (s *Server) ask(ctx context.Context, fr *quota.FleetRule, key string, l *lease, need uint64) {
	now := s.o.Now()
	l.mu.Lock()
	used := l.used
	if need > 0 {
		need = max(need, l.waiting) // the waiting calls' hits, this one's among them
	}
	want := max(need, 1)
	top := fr.Rule.Config.Limit + fr.Rule.Config.Burst
	switch {
	case l.once || l.exact || l.askedAt == 0 || used == 0:
	default:
		horizon := askHorizon
		if w := fr.Rule.Config.Window; fr.Rule.Config.Algorithm == limit.FixedWindow {
			// Never past the window's end (epoch-aligned windows), and never
			// the rest of a long window: units a replica holds are budget the
			// key's other holders cannot have, and a replica that dies keeps
			// them until the window ends.
			horizon = min(horizon, w-time.Duration(now%int64(w)))
		}
		// Over at least minDemandSpan: a few decisions just after a grant
		// are no rate to lease a long window's budget for.
		demand := float64(used) * float64(horizon) / float64(max(now-l.askedAt, int64(minDemandSpan)))
		if float64(l.left) >= farFromLimit*demand {
			// Far from the limit, twice the demand: a window's demand
			// scatters by more than a quarter, and each refill it would
			// start is a store round; units held beyond need cost the
			// key's other holders nothing while this much is left.
			demand *= 2
		} else {
			demand *= 1.25
		}
		want = max(want, uint64(min(demand, float64(limit.MaxLimit)))+1)
	}
	want = min(want, top)
	if l.once && need == 0 {
		want = 0 // a check on a lease not kept: what is left, no units
	}
	short := need - min(need, l.units)
	var ret uint64
	if l.units > 0 && now >= l.end {
		ret, l.units = l.units, 0
	}
	stale, charge := l.stale, l.charge
	l.stale, l.charge = 0, 0
	l.used = 0
	l.askedAt = now
	l.mu.Unlock()

	s.m.asks.Inc()
	res, err := s.o.Quota.Assign(ctx, []quota.Assignment{{Rule: fr, Key: key, Entry: s.entry,
		Used: used, Return: ret + stale, Charge: charge, Want: want, Need: short, Interval: askInterval, Reserve: perCallUnits}})

	l.mu.Lock()
	ch := l.asking
	l.asking = nil
	if err != nil || res[0].Status == sq.StatusRetry {
		if err == nil {
			err = errors.New("the key's ledger is full (retry)")
		}
		s.m.askFailures.Inc()
		s.warn("ask", "rls: the quota service could not decide; deciding by on_quota_failure", "key", key, "err", err)
		l.used += used // not reported: report it with the next ask
		l.units += ret
		l.stale += stale
		l.charge += charge
		l.failed = s.o.Now() + int64(failureHold)
		l.mu.Unlock()
		close(ch)
		return
	}
	recall := l.record(fr, res[0], need) && s.o.Recalls != nil
	l.mu.Unlock()
	close(ch)
	if recall {
		s.publishRecall(key)
	}
}

// record takes the quota service's answer r to an ask that needed need units
// (0: a refill) into the lease, and reports whether the ask lacked units that
// other holders' leases hold (to recall them). The caller holds l.mu.
func (l *lease) record(fr *quota.FleetRule, r quota.AssignResult, need uint64) (heldElsewhere bool) {
	l.failed, l.heldElsewhere = 0, 0
	l.left, l.exact = r.Left, r.Left <= perCallUnits
	if l.fp != fr.Rule.Fingerprint {
		// The key's rule changed while the ask was out (a limit override of
		// another limit on the same counter): units granted under the old
		// one are not this one's to spend; the next ask returns them.
		l.stale += r.Granted
		return false
	}
	if r.Granted > 0 {
		if r.Tag != l.tag || r.End > l.end {
			if r.Tag != l.tag {
				l.units = 0
			}
			l.tag, l.end = r.Tag, r.End
		}
		l.units += r.Granted
		l.last = l.units
		l.refused = 0
		return false
	}
	if need > 0 && l.units < need && r.HeldElsewhere > 0 {
		// Other holders' leases hold units: the calls wait for them (take),
		// and the holders are asked to give them back.
		l.heldElsewhere = r.HeldElsewhere
		l.heldRetry = r.Now + int64(min(max(r.RetryAfter, time.Millisecond), heldGiveUp))
		return true
	}
	if need > 0 && l.units < need {
		// Nothing now: the budget is spent until RetryAfter (capped, so that
		// units another replica returns are found within a second). Nothing
		// at all: a key with fewer units than the ask needed grants those
		// (Assignment.Need), so a call short of even one unit is refused.
		l.refused = r.Now + int64(min(max(r.RetryAfter, time.Millisecond), time.Second))
		l.refusedNeed = 1
	}
	return false
}

// onFailure decides a descriptor the quota service could not: by the rule's
// on_quota_failure, "pass" admits, "deny" refuses and "local" (the default)
// admits up to local_share of the limit per replica (the whole limit without
// one) from a limiter of the replica's own.
func (s *Server) onFailure(fr *quota.FleetRule, key string, hits uint64, now int64) outcome {
	cfg := fr.Rule.Config
	o := outcome{failed: true, reset: cfg.Window}
	switch fr.Rule.Rule.QuotaFailure() {
	case "pass":
		o.admitted = true
		o.remaining = cfg.Limit
	case "deny":
	default:
		o.admitted, o.remaining = s.local.decide(fr, key, hits, now)
	}
	s.m.failureDecisions.WithLabelValues(fr.Rule.Rule.QuotaFailure(), codeName(o.admitted)).Inc()
	return o
}

// localLimits are the replica's own limiters, used while the quota service
// fails: one state per key, of the rule's algorithm at its local share.
type localLimits struct {
	mu     sync.Mutex
	states map[string]localState
	max    int
}

type localState struct {
	fp    uint64
	lim   limit.Limiter
	state []byte
}

func (ll *localLimits) decide(fr *quota.FleetRule, key string, hits uint64, now int64) (bool, uint64) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	st, ok := ll.states[key]
	if !ok || st.fp != fr.Rule.Fingerprint {
		cfg := fr.Rule.Config
		if share := fr.Rule.Rule.LocalSharePermille; share > 0 {
			cfg.Limit = max(1, cfg.Limit*uint64(share)/1000)
			if cfg.Burst > 0 {
				cfg.Burst = max(1, cfg.Burst*uint64(share)/1000)
			}
		}
		lim, err := limit.New(cfg)
		if err != nil {
			return true, 0 // a share the algorithm refuses: admit, as pass
		}
		if len(ll.states) >= ll.max {
			clear(ll.states)
		}
		st = localState{fp: fr.Rule.Fingerprint, lim: lim, state: make([]byte, lim.StateSize())}
	}
	next := make([]byte, len(st.state))
	d := st.lim.Decide(st.state, next, now, hits)
	if d.Allowed {
		st.state = next
	}
	ll.states[key] = st
	return d.Allowed, d.Remaining
}

// sweep returns the units of leases unused for idleAfter and forgets them.
func (s *Server) sweep(ctx context.Context) { s.giveBack(ctx, false) }

// ReturnLeases reports and returns the units of every lease the replica
// holds, and forgets them, within ctx: a replica that stops hands its budget
// back to the key's other holders instead of keeping it until the window ends.
// Decisions after it ask afresh. It returns how many keys it reported.
func (s *Server) ReturnLeases(ctx context.Context) int { return s.giveBack(ctx, true) }

// giveBack reports and returns the units of the leases unused for idleAfter
// (all: every lease with no ask in flight) and forgets them.
func (s *Server) giveBack(ctx context.Context, all bool) int {
	now := s.o.Now()
	var backs []giveBack
	s.leases.mu.Lock()
	for k, l := range s.leases.m {
		l.mu.Lock()
		if l.asking == nil && (all || now-l.lastUse > int64(idleAfter) && now-l.askedAt > int64(idleAfter)) {
			delete(s.leases.m, k)
			l.gone = true
			ret := l.units
			if now >= l.end {
				ret = 0
			}
			ret += l.stale
			if l.rule != nil && l.used+ret+l.charge > 0 {
				backs = append(backs, giveBack{rule: l.rule, key: k, used: l.used, ret: ret, charge: l.charge})
			}
			l.units, l.used, l.stale, l.charge = 0, 0, 0, 0
		}
		l.mu.Unlock()
	}
	s.leases.mu.Unlock()
	n := len(backs)
	// The keys are distinct: one quota service call a batch (one timeout,
	// not one per key, when the store is down).
	for len(backs) > 0 && ctx.Err() == nil {
		batch := backs[:min(len(backs), giveBackBatch)]
		backs = backs[len(batch):]
		asks := make([]quota.Assignment, len(batch))
		for i, b := range batch {
			asks[i] = quota.Assignment{Rule: b.rule, Key: b.key, Entry: s.entry, Used: b.used, Return: b.ret, Charge: b.charge, Interval: askInterval}
		}
		s.m.asks.Add(float64(len(asks)))
		if _, err := s.o.Quota.Assign(ctx, asks); err != nil {
			s.m.askFailures.Add(float64(len(asks)))
		}
	}
	return n
}

// giveBackBatch is how many keys one quota service call of giveBack reports.
const giveBackBatch = 64

// giveBack is a forgotten lease's report: units it used since its last ask,
// units it returns, and units on_quota_failure admitted, to charge.
type giveBack struct {
	rule              *quota.FleetRule
	key               string
	used, ret, charge uint64
}
