package quota

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Sizing and ledger constants (see docs/fleet.md).
const (
	// DefaultValidity is the longest lease of a token_bucket or gcra key, unless one
	// unit refills more slowly: then a lease lasts one unit's refill time.
	DefaultValidity = 10 * time.Second
	// Headroom is the sizing factor: a grant covers the Envoy's recent rate for
	// Headroom × its report interval (5/4: a little more than one report period).
	headroomNum, headroomDen = 5, 4
	// MaxEnvoysPerKey is the default bound of a key's ledger
	// (Options.MaxEntriesPerKey; about 100 bytes of Redis memory an entry): a
	// further Envoy is answered retry until the sweep has forgotten entries whose
	// Envoys stopped reporting (forgetAfter).
	MaxEnvoysPerKey = 1 << 18
	// retainReports is how many report intervals an Envoy counts as active for a key
	// after its last report (it shares the remainder while active).
	retainReports = 3
	// ttlSlack is added to every stored value's expiry: a value outlives by this
	// much the moment it becomes equivalent to an absent one, so clock differences
	// between replicas and the store never drop a live state.
	ttlSlack = 10 * time.Second
	// maxSkew is how far a key's clock may run ahead of a replica's: the largest
	// difference between replicas' clocks that is absorbed (see decide).
	maxSkew = ttlSlack
)

// fleetLimiter is a fleet rule's global algorithm: the rule's Limiter for the window
// algorithms, and for token_bucket and gcra a Limiter whose capacity is smaller by the
// k units that refill during one lease validity V (see newFleetLimiter).
type fleetLimiter struct {
	lim      limit.Limiter
	alg      limit.Algorithm
	validity time.Duration // token_bucket, gcra: V
	limit    uint64        // token_bucket, gcra: Limit (ticks per ns)
	tick     uint64        // token_bucket, gcra: Window (ticks per unit)
	window   uint64        // time_wheel: Window ns
	slots    uint64        // time_wheel: Slots
}

var errNotFleet = errors.New("quota: rule not fleet-capable")

// newFleetLimiter builds the global limiter of a fleet rule with configuration cfg
// (validated, defaults not needed) and longest validity maxV.
//
// token_bucket and gcra: a lease spent up to V after it was granted makes the fleet
// admit, over any interval of length t, at most what the global bucket granted over
// t+V: C' + Limit·(t+V)/Window. With C' = C − k and k >= Limit·V/Window this is at most
// C + Limit·t/Window, the rule's own bound. k = min(⌊C/2⌋, ⌊Limit·maxV/Window⌋), at
// least 1, and V = ⌊k·Window/Limit⌋.
func newFleetLimiter(cfg limit.Config, maxV time.Duration) (*fleetLimiter, error) {
	if ok, _ := rules.FleetCapable(cfg); !ok {
		return nil, errNotFleet
	}
	f := &fleetLimiter{alg: cfg.Algorithm}
	switch cfg.Algorithm {
	case limit.TokenBucket, limit.GCRA:
		capacity := cfg.Burst
		if cfg.Algorithm == limit.TokenBucket && capacity == 0 {
			capacity = cfg.Limit
		}
		if cfg.Algorithm == limit.GCRA {
			capacity = cfg.Burst + 1
		}
		// ⌊Limit·maxV/Window⌋ in 128 bits.
		hi, lo := bits.Mul64(cfg.Limit, uint64(maxV))
		var k uint64
		if hi >= uint64(cfg.Window) {
			k = 1 << 62
		} else {
			k, _ = bits.Div64(hi, lo, uint64(cfg.Window))
		}
		k = max(1, min(k, capacity/2))
		hi, lo = bits.Mul64(k, uint64(cfg.Window))
		v, _ := bits.Div64(hi, lo, cfg.Limit) // k·Window/Limit <= MaxRefill fits
		f.validity = time.Duration(v)
		f.limit, f.tick = cfg.Limit, uint64(cfg.Window)
		if cfg.Algorithm == limit.TokenBucket {
			cfg.Burst = capacity - k
		} else {
			cfg.Burst -= k
		}
	case limit.TimeWheel:
		if cfg.Slots == 0 {
			cfg.Slots = limit.DefaultSlots
		}
		f.window, f.slots = uint64(cfg.Window), uint64(cfg.Slots)
	}
	lim, err := limit.New(cfg)
	if err != nil {
		return nil, err
	}
	f.lim = lim
	return f, nil
}

// tag identifies the window (fixed_window: its end) or slot (time_wheel: its index)
// a normalised state counts in; 0 for the buckets.
func (f *fleetLimiter) tag(state []byte) uint64 {
	switch f.alg {
	case limit.FixedWindow, limit.TimeWheel:
		return binary.LittleEndian.Uint64(state)
	}
	return 0
}

// leaseEnd returns when a lease of tag ends: the window end, the end of the slot, or
// for the buckets now+V (start is the lease's existing end, 0 if none).
func (f *fleetLimiter) leaseEnd(tag uint64, now, start int64) int64 {
	switch f.alg {
	case limit.FixedWindow:
		return int64(tag)
	case limit.TimeWheel:
		// start of slot tag+1: ⌈(tag+1)·Window/Slots⌉.
		hi, lo := bits.Mul64(tag+1, f.window)
		if hi >= f.slots {
			return 1<<63 - 1
		}
		q, r := bits.Div64(hi, lo, f.slots)
		if r != 0 {
			q++
		}
		return int64(min(q, 1<<63-1))
	}
	if start > now {
		return start
	}
	return now + int64(f.validity)
}

// load decodes a key's stored header; an absent one is a fresh key with no
// leases. A header that is present and does not decode is errFormat: reading it
// as fresh would grant the key's budget again over the leases already out.
func (f *fleetLimiter) load(old []byte) (header, error) {
	size := f.lim.StateSize()
	h, err := decodeHeader(old, size)
	if err != nil {
		return header{}, err
	}
	if h.state == nil {
		h = header{state: make([]byte, size)}
	}
	return h, nil
}

// keyNow is the time a key is decided at by a replica whose clock says now.
//
// The key's clock never goes back: a replica whose clock is behind the one that
// last wrote the key decides at that replica's time (the latest decision on the
// key), at most maxSkew ahead of its own. Deciding at a time earlier than the
// state's would let one replica read the other's buckets as refilled (or as
// implausible, hence fresh) and grant again, every time. The cap is relative to
// this replica's own clock, whatever the order of the reports.
func keyNow(h *header, now int64) int64 {
	return min(max(h.latest, now), now+int64(maxSkew))
}

// until is when h, decided at now (the key's clock), becomes equivalent to an
// absent value: its state is idle, every lease has ended and every entry would
// be forgotten (Unix ns).
func (f *fleetLimiter) until(h *header, now int64) int64 {
	return max(f.lim.IdleAt(h.state, now), h.maxExp, h.latest+int64(forgetAfter))
}

// store encodes h for the backend, with the key's expiry (Op.TTL). Time is cut
// into spans of ttlSlack, and a key whose until (the moment it becomes
// equivalent to an absent value) falls in span k expires at the end of span
// k+1: at least ttlSlack past its until. prev is the until of the value read
// (0: none), which this write replaces; while the until stays in prev's span
// or an earlier one, the expiry that value's write left still holds, and it is
// left as it is (TTL 0: the round makes one Redis command fewer, the PEXPIRE).
func (f *fleetLimiter) store(h *header, now, prev int64) ([]byte, time.Duration) {
	now = keyNow(h, now)
	until := f.until(h, now)
	h.writes++
	next := h.encode(make([]byte, 0, 96+len(h.state)+ringSlots*9))
	span := int64(ttlSlack)
	if prev > 0 && until/span <= prev/span {
		return next, 0
	}
	return next, time.Duration(max((until/span+2)*span-now, int64(ttlSlack)))
}

// assignOpts are the differences of an assignment-style lease (Envoy's native
// rate_limit_quota filter, package rlqs) from a filter lease: each grant replaces the
// Envoy's previous units, so sizing does not subtract what it holds; units it
// admitted without any lease are charged (as the filter's, quota.KeyRequest.Charge);
// and a grant is made only when the lease
// lasts long enough for the Envoy to use it.
type assignOpts struct {
	// minLife is the shortest lease worth granting, in ns from now: a lease that
	// would end sooner grants nothing (StatusRefused, RetryAfter until it ends).
	minLife int64
	// fit, when set, rounds a grant down to what the assignment can use whole
	// (Assignment.Fit).
	fit func(units uint64, life time.Duration) uint64
	// keep: a grant of at most this many units is not made (Assignment.Keep).
	keep uint64
	// need: the grant is at least this many units when the key has them
	// (Assignment.Need).
	need uint64
	// reserve: the key's last units, granted only for need
	// (Assignment.Reserve).
	reserve uint64
	// left is set by decide: the key's units left after the ask
	// (AssignResult.Left); heldElsewhere, what the other entries hold
	// (AssignResult.HeldElsewhere).
	left, heldElsewhere uint64
}

// assignmentEntry reports whether a ledger entry is an assignment client's (an
// RLQS stream: EntryName(owner, "rlqs:…")), whose window share is kept for it
// (share). A filter whose Envoy id begins so only keeps its own share.
func assignmentEntry(name string) bool {
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return strings.HasPrefix(name, "rlqs:")
}

// retainFor is how long an Envoy counts as active for a key after its last
// report, seen by an asker reporting every interval: retainReports intervals of
// the asker, or of the slowest client (reserveBefore, Envoy's own quota filter
// reporting every 5 s) if that is longer, so that a filter lease topping up every
// second does not forget an assignment client between two of its reports.
func retainFor(interval time.Duration) int64 {
	return int64(retainReports) * int64(max(interval, reserveBefore))
}

// reserveBefore is how long before a fixed window's end the shares of Envoys
// that have not yet asked for theirs stop being kept for them: the longest report
// interval of a client (Envoy's own quota filter reports every 5 s), so that every
// Envoy reports at least once while its share is kept.
const reserveBefore = 5 * time.Second

// share is the most one ask of d.me (whose stored value was d.old) may be
// granted, with d.others other active entries (a report within retain) in d.l,
// d.assignments assignment clients (RLQS streams) among them, and
// d.probe.Remaining units left at d.now.
//
// Fixed windows are shared per window: each of the n active Envoys has a fair
// share of the window's limit, ⌊L/n⌋ and at least 1 (with ⌈L/n⌉ the first n−1
// askers of a window could take it all, and the same last one got none window
// after window), and may take what is left of its own
// (entry.granted counts what it was granted in the window), or a share of what the
// assignment clients' unclaimed shares leave of the remainder, split as before
// among the Envoys and a newcomer, whichever is more; nothing (0) when its own is
// spent and the rest is kept for assignment clients. Until reserveBefore the
// window's end an assignment client (Envoy's own quota filter, reporting every
// 5 s: it asks twice in a 10 s window while a filter lease tops up every second)
// finds its share kept, however often the others ask; after that, what is left
// goes to whoever asks. A Wasm filter's lease that holds units unspent asks
// ahead of need (its report finds it running low): until 5 s before the
// window's end it takes what is left of its own fair share, or a share of what
// the window has beyond the other active Envoys' unclaimed fair shares
// (unclaimed), never from those; with neither it is answered a grant of 0
// (d.heldBack), never refused. An ask made dry (nothing held) takes a share of
// the whole remainder: an Envoy holding its lease without asking must not keep
// budget from one whose demand is real now. What the assignment
// clients have claimed is the header's sum of their grants in the window
// (grantedA), so a share above ⌊L/n⌋ counts against the others' reserve.
//
// Alone on the key an Envoy may take half the remainder (so that a newcomer still
// finds some). Other algorithms with others: half the remainder split among them
// and a newcomer, or the Envoy's equal share of the budget in play (what remains
// and what the entries hold, the header's heldSum) less what it holds (nothing
// for an assignment, which replaces it), whichever is more.
func (f *fleetLimiter) share(d *decision) uint64 {
	l, name, me, old := d.l, d.envoy, d.me, &d.old
	others, assignments := d.others, d.assignments
	remaining, lim, tag, now := d.probe.Remaining, d.probe.Limit, d.tag, d.now
	assignment := d.ao != nil
	held := me.held
	if assignment {
		held = 0
	}
	if others == 0 {
		return max(1, remaining/2)
	}
	if f.alg == limit.FixedWindow {
		n := others + 1
		fairW := max(lim/n, 1)
		got := min(me.granted, fairW)
		if me.tag != tag {
			got = 0
		}
		var reserved uint64
		if int64(tag)-now > int64(reserveBefore) && assignments > 0 {
			claimed := l.grantedA
			if l.winTag != tag {
				claimed = 0
			} else if assignmentEntry(name) && old.tag == tag {
				claimed -= min(claimed, old.granted)
			}
			reserved = assignments*fairW - min(claimed, assignments*fairW)
		}
		mine := fairW - got
		free := remaining - min(remaining, reserved)
		if mine == 0 && free == 0 && reserved > 0 {
			// All that is left is kept for assignment clients that have not
			// claimed their shares yet: nothing until that ends (decide answers
			// refused, to ask again when the reserve ends). A unit a call would
			// let an Envoy that asks every time its lease runs dry drain the
			// reserve one unit at a time.
			return 0
		}
		if !assignment && me.held > 0 && int64(tag)-now > int64(reserveBefore) {
			// A top-up of a filter lease with units unspent: it is not short
			// now, so it takes what is left of its own fair share, and of the
			// rest only a share of what the others have not claimed of theirs
			// (heldBack when that leaves it nothing).
			kept := f.unclaimed(d, fairW)
			if g := max(min(mine, remaining), (free-min(free, kept))/(others+2)); g > 0 || kept == 0 {
				return max(1, g)
			}
			d.heldBack = true
			return 0
		}
		return max(1, min(mine, remaining), free/(others+2))
	}
	inPlay := remaining + held + (l.heldSum - min(l.heldSum, old.held))
	fair := inPlay / (others + 1)
	return max(1, remaining/(others+2), fair-min(fair, held))
}

// unclaimed is what the other active Envoys of a fixed window have not yet
// claimed of their fair shares fairW each: others·fairW less what the window
// has spent (its limit less d.probe.Remaining: grants and charges) apart from
// the asker's own grants in it. Exact while no other Envoy took more than its
// fair share; an Envoy that did (it asked before the others came) makes it
// smaller, never larger, than what the others lack.
func (f *fleetLimiter) unclaimed(d *decision, fairW uint64) uint64 {
	spent := d.probe.Limit - min(d.probe.Limit, d.probe.Remaining)
	if d.me.tag == d.tag {
		spent -= min(spent, d.me.granted)
	}
	due := d.others * fairW
	return due - min(due, spent)
}

// decision is one ask being decided on a ledger (decide): the ask, the key's
// state as it is changed, and the asker's entry.
type decision struct {
	l        *ledger
	now      int64 // the key's clock (keyNow)
	envoy    string
	k        *quota.KeyRequest
	interval time.Duration
	ao       *assignOpts // nil for the filter's leases

	cur, tmp []byte         // the limiter state as changed so far, and scratch
	probe    limit.Decision // the state at now, asking nothing
	tag      uint64         // the window or slot now is in (fleetLimiter.tag)

	me    *entry
	old   entry // me as stored
	fresh bool  // me was created by this ask
	// renew: the filter asked near the end of its bucket lease; a grant starts
	// a lease of its own (begin, record).
	renew bool
	// others active entries besides me, assignments of them assignment clients.
	others, assignments uint64
	// heldBack: share granted nothing because the asker holds its fair share
	// of the window with units unspent and what is left is the others' due;
	// the answer is a grant of 0 (StatusGranted), not a refusal.
	heldBack bool
	res      quota.KeyResult
}

// decide applies one Envoy's report and ask for one key to the ledger l at now
// (service clock, Unix ns), sizing the grant for a report interval of interval,
// and reports whether l changed. Several asks decided one after another on one l
// are what a round records with one write; the asker's entry is in l.entries
// when it is stored. ao is nil for the filter's leases. The steps: find the
// asker's entry (begin), apply its report (settle), size the grant (size) and
// record it (record).
func (f *fleetLimiter) decide(l *ledger, now int64, envoy string, k *quota.KeyRequest, interval time.Duration, ao *assignOpts) (quota.KeyResult, bool) {
	d := &decision{l: l, envoy: envoy, k: k, interval: interval, ao: ao}
	if !f.begin(d, now) {
		return d.res, false
	}
	f.settle(d)
	granted := f.size(d)
	f.record(d, granted)
	if ao != nil {
		ao.left = f.lim.Decide(d.cur, d.tmp, d.now, 0).Remaining
		if l.maxExp > d.now {
			ao.heldElsewhere = l.heldSum - min(l.heldSum, d.me.held)
		}
	}
	return d.res, true
}

// begin normalises the key's state at now, finds or creates the asker's entry,
// ends a lease that is over and counts the other active entries. False, with
// d.res a retry, when the ledger has no room for a newcomer.
func (f *fleetLimiter) begin(d *decision, now int64) bool {
	l := d.l
	size := f.lim.StateSize()
	d.now = keyNow(&l.header, now)
	now = d.now
	d.cur, d.tmp = make([]byte, size), make([]byte, size)
	// Normalise the state at now (a probe decides nothing).
	d.probe = f.lim.Decide(l.state, d.cur, now, 0)
	d.tag = f.tag(d.cur)
	l.ring.advance(slotOf(now))
	d.res.Key = d.k.Key
	d.me = l.entries[d.envoy]
	if d.me == nil {
		if l.count >= l.maxEntries {
			// Every slot is taken: the newcomer is answered retry (the key's budget
			// may well remain), and comes in when the sweep has forgotten an Envoy
			// that stopped reporting.
			l.sweepSoon = true
			d.res.Status = quota.StatusRetry
			d.res.RetryAfter = max(d.interval, time.Second)
			return false
		}
		d.me, d.fresh = l.create(d.envoy), true
	}
	d.old = *d.me
	me := d.me
	// A lease that ended or belongs to another window/slot is over; its units are
	// never credited back (they were counted where they were granted).
	if me.held > 0 && (me.exp <= now || me.tag != d.tag) {
		me.held, me.exp = 0, 0
	}
	// A bucket's lease keeps the end of its first grant while it holds units
	// (leaseEnd), so a filter's key in steady use, whose lease never empties, lost
	// it at every end and its requests waited for a call. A filter asking within
	// two of its report intervals of the end renews it (record): if anything is
	// granted, what it still holds is given up, as it would be at the end (spent
	// from the bucket when granted, never credited back), and the grant, sized as
	// if nothing were held, starts a lease of its own, which the filter takes in
	// place of the old one (the answer's held is the grant alone).
	d.renew = d.ao == nil && f.validity > 0 && me.held > 0 && d.k.Want > 0 && me.exp-now <= 2*int64(d.interval)
	retain := retainFor(d.interval)
	all, assignments := l.ring.active(now, retain)
	if !d.fresh && l.ring.counts(d.old.last, now, retain) {
		all--
		if assignmentEntry(d.envoy) {
			assignments--
		}
	}
	d.others, d.assignments = all, assignments
	return true
}

// settle applies the asker's report: used units are no longer held, returned
// ones are credited back (within the rules below), and units admitted without a
// lease are charged.
func (f *fleetLimiter) settle(d *decision) {
	me, k, now := d.me, d.k, d.now
	// Units the Envoy reports used were spent: they are no longer held, neither for
	// sizing (a steadily used key would otherwise be sized down to single units once
	// its grants add up to more than its demand) nor as returnable. The lease keeps
	// its end (me.exp), so units still unspent never outlive it.
	if k.Used > 0 && me.held > 0 {
		me.held -= min(k.Used, me.held)
	}

	// Returns: only of a live lease, at most what it holds.
	var returned uint64
	if k.Return > 0 && me.held > 0 {
		returned = min(k.Return, me.held)
		if f.validity > 0 {
			// A bucket refills to its capacity and no further, so units of this lease
			// may already have been "refilled over" while the bucket was full, and
			// crediting them would count them twice. A return is credited as a
			// reduction of the lease's first grant (at most what is left of it), and
			// never takes the debt below what the grants made after that one
			// (total-seq units) can account for: then the bucket is never emptier
			// than if the first grant had been smaller by the credit.
			since := d.l.total - me.seq
			debt := f.debtUnits(d.cur, now)
			if debt > since {
				returned = min(returned, debt-since, me.unspent)
			} else {
				returned = 0
			}
			me.unspent -= returned
		} else if me.tag == d.tag {
			me.granted -= min(returned, me.granted) // back in the window's budget: its share again
		}
		me.held -= min(k.Return, me.held)
		f.lim.Adjust(d.cur, d.tmp, now, -int64(returned))
		copy(d.cur, d.tmp)
		if me.held == 0 {
			me.exp = 0
		}
		d.probe = f.lim.Decide(d.cur, d.tmp, now, 0)
	}
	d.res.Returned = returned

	// Units admitted without a lease (quota.KeyRequest.Charge) are spent: they
	// count, even past the limit. A filter's are also its share of the window
	// taken (entry.granted), so an Envoy that admitted by itself while cut off
	// takes that much less afterwards and the others keep theirs.
	if k.Charge > 0 {
		charge := min(k.Charge, limit.MaxLimit)
		f.lim.Adjust(d.cur, d.tmp, now, int64(charge))
		copy(d.cur, d.tmp)
		d.probe = f.lim.Decide(d.cur, d.tmp, now, 0)
		if f.validity == 0 && d.ao == nil {
			if me.tag != d.tag {
				me.tag, me.granted = d.tag, 0
			}
			me.granted += charge
		}
	}
}

// size decides how many units to grant: what the Envoy asks for, cut to its
// demand (its reported use over the time since its last ask, with headroom)
// and to its share, and what the limiter then allows; it sets d.res.RetryAfter
// when less than asked is granted.
func (f *fleetLimiter) size(d *decision) uint64 {
	k, ao, me, now := d.k, d.ao, d.me, d.now
	var granted uint64
	tooShort := false
	var life int64
	if ao != nil && k.Want > 0 {
		if life = f.leaseEnd(d.tag, now, 0) - now; life < ao.minLife {
			tooShort = true
			d.res.RetryAfter = time.Duration(max(life, 0))
		}
	}
	if k.Want == 0 || tooShort {
		return 0
	}
	want := k.Want
	if ao == nil && me.last > 0 && me.last < now && k.Used > 0 {
		elapsed := uint64(now - me.last)
		hi, lo := bits.Mul64(k.Used, uint64(d.interval)*headroomNum)
		var demand uint64
		dd := elapsed * headroomDen
		if hi >= dd {
			demand = want
		} else {
			demand, _ = bits.Div64(hi, lo, dd)
			demand++
		}
		held := me.held
		if d.renew {
			held = 0 // given up if this grants anything
		}
		if demand > held {
			want = min(want, demand-held)
		} else {
			want = 1
		}
	}
	want = min(want, f.share(d))
	if ao != nil {
		if ao.reserve > 0 {
			// Ahead of need, never into the key's last reserve units.
			rem := d.probe.Remaining
			want = min(want, rem-min(rem, ao.reserve))
		}
		want = max(want, ao.need)
	}
	fit := func() {
		if ao != nil && ao.fit != nil {
			if fit := ao.fit(want, time.Duration(life)); fit > 0 {
				want = fit
			}
		}
	}
	fit()
	if ao != nil && want <= ao.keep {
		want = 0 // the caller keeps its live assignment (Assignment.Keep)
	}
	dec := f.lim.Decide(d.cur, d.tmp, now, want)
	if !dec.Allowed && dec.Remaining > 0 {
		want = min(want, dec.Remaining)
		fit()
		if ao != nil && want <= ao.keep {
			want = 0 // what is left would replace no more than the live assignment holds
		}
		dec = f.lim.Decide(d.cur, d.tmp, now, want)
	}
	if dec.Allowed {
		granted = want
		copy(d.cur, d.tmp)
	}
	if granted < k.Want {
		more := f.lim.Decide(d.cur, d.tmp, now, 1)
		d.res.RetryAfter = more.RetryAfter
		if want == 0 && more.Allowed {
			// Held back for the assignment clients (share): until their
			// shares stop being kept.
			d.res.RetryAfter = max(d.res.RetryAfter, time.Duration(int64(d.tag)-int64(reserveBefore)-now))
		}
	}
	return granted
}

// record answers the ask with granted units: its status, the lease (its units,
// end and window) and the ledger's totals, and the key's new state.
func (f *fleetLimiter) record(d *decision, granted uint64) {
	l, me, k, now, tag := d.l, d.me, d.k, d.now, d.tag
	switch {
	case d.heldBack:
		d.res.Status, d.res.RetryAfter = quota.StatusGranted, 0
	case granted == 0 && k.Want > 0:
		d.res.Status = quota.StatusRefused
	case granted < k.Want:
		d.res.Status = quota.StatusPartial
	default:
		d.res.Status = quota.StatusGranted
	}
	if granted > 0 {
		l.total += granted
		if d.renew {
			me.held, me.exp = 0, 0
		}
		switch {
		case f.validity == 0:
			// Fixed window, time wheel: granted counts what the Envoy was
			// granted under tag (share).
			if me.tag != tag {
				me.granted = 0
			}
			me.granted += granted
		case me.held == 0:
			me.seq, me.unspent = l.total, granted
		}
		start := me.exp
		if d.ao != nil {
			start = 0 // every assignment is a lease of its own, from now
		}
		me.exp = f.leaseEnd(tag, now, start)
		me.tag = tag
		me.held += granted
	}
	me.last = now
	l.update(d.envoy, d.old, d.fresh, me, tag)
	d.res.Granted, d.res.Held = granted, me.held
	d.res.Envoys = uint32(min(d.others+1, 1<<32-1))
	if me.held > 0 {
		d.res.ExpiresIn = time.Duration(me.exp - now)
	}
	l.state = d.cur
	if f.alg == limit.FixedWindow && d.ao == nil && int64(tag) > now {
		// What a cut-off Envoy may admit by itself in this window: its share
		// of what the window has left beyond every lease (quota.KeyResult.Left).
		left := f.lim.Decide(d.cur, d.tmp, now, 0).Remaining
		d.res.Left, d.res.LeftFor = left/(d.others+1), time.Duration(int64(tag)-now)
	}
}

// debtUnits returns ⌊D/Window⌋, the whole units a token_bucket or gcra state lacks
// from full at now: D = (tat−now)·Limit + frac ticks (the layout in
// shared/limit/tat.go). The state is normalised (written by Decide at now).
func (f *fleetLimiter) debtUnits(state []byte, now int64) uint64 {
	at := int64(binary.LittleEndian.Uint64(state))
	frac := binary.LittleEndian.Uint64(state[8:])
	if at < now {
		return 0
	}
	hi, lo := bits.Mul64(uint64(at-now), f.limit)
	var c uint64
	lo, c = bits.Add64(lo, frac, 0)
	hi += c
	if hi >= f.tick {
		return 1 << 62
	}
	q, _ := bits.Div64(hi, lo, f.tick)
	return q
}
