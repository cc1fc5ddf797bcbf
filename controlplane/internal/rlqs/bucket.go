package rlqs

import (
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/shared/limit"
	sq "github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Bucket id entries (docs/rlqs.md): "policy" and "rule" name the fleet rule; every
// other entry is one key part of the rule, named as in its "key" list.
const (
	EntryPolicy = "policy"
	EntryRule   = "rule"
)

// Why a bucket is abandoned (the reason label of
// sluice_controlplane_rlqs_abandoned_total), besides quota.Reason*.
const (
	ReasonNoPolicyEntry  = "no_policy_entry"  // the bucket id has no "policy" or "rule"
	ReasonUnknownEntry   = "unknown_entry"    // an entry names no key part of the rule
	ReasonBadValue       = "bad_value"        // client_ip is not an IP address
	ReasonMissingKeyPart = "missing_key_part" // a key part of the rule has no value
	ReasonCost           = "unsupported_cost" // the rule's cost is not 1 request = 1 unit
	ReasonLeaseTooShort  = "lease_too_short"  // the rule's leases end before an assignment could be used
	ReasonTooManyBuckets = "too_many_buckets" // the stream holds Options.MaxBucketsPerStream
	ReasonIdle           = "idle"             // no request for Options.IdleAfter
)

// request builds the filter's view of a request from a bucket id's key-part entries,
// so that FleetRule.Key builds the very counter key the Wasm filter builds for
// the same values. Every entry but policy and rule must name a part of the rule's
// key (one alternative of an element of keyParts, or "route"): an entry the rule
// does not key on would only make more buckets of one counter, so it is
// refused, not kept. It returns a reason when an entry is not such a part.
func request(entries map[string]string, keyParts []string) (rules.Request, string) {
	var req rules.Request
	for name, v := range entries {
		switch {
		case name == EntryPolicy || name == EntryRule:
			continue
		case name == "route":
			continue // route's value is the rule's own
		case !keysOn(keyParts, name):
			return req, ReasonUnknownEntry
		}
		switch known, valid := req.SetPart(name, v); {
		case !known:
			return req, ReasonUnknownEntry
		case !valid:
			return req, ReasonBadValue
		}
	}
	return req, ""
}

// keysOn reports whether name is one alternative of an element of keyParts
// (alternatives are joined by '|').
func keysOn(keyParts []string, name string) bool {
	for _, p := range keyParts {
		for alt := range strings.SplitSeq(p, "|") {
			if alt == name {
				return true
			}
		}
	}
	return false
}

// sent is one action sent for a bucket: a token bucket of units reserved, or a
// blanket rule (units 0), which ends the token bucket before it just as well.
type sent struct {
	units uint64
	at    int64 // when it was sent (Unix ns, taken after the send)
	ttl   int64 // its assignment_time_to_live, ns
}

// bucket is the stream's accounting of one bucket (docs/rlqs.md, "Returns").
type bucket struct {
	rule *quota.FleetRule
	key  string

	// Coverage of reported use, across epochs: the assignments sent, oldest first,
	// each with the units of it no report has spent yet (credit.left), dropped once
	// it is dead for every later report (as pending settles); and owed, the units
	// reported allowed that no live assignment covered (fail-open admissions), not
	// yet charged.
	credits []credit
	owed    uint64

	// The current epoch: one window (fixed_window) or slot (time_wheel), forever
	// for the buckets. Returns are only made for units of the epoch.
	tag       uint64
	pending   []sent // sent in this epoch and not yet settled, oldest first
	settled   uint64 // units of settled grants of this epoch
	epochUsed uint64 // units reported allowed in this epoch
	returned  uint64 // units returned in this epoch

	// Reported but not yet recorded by the service (the last call failed).
	unrecordedUsed uint64

	lastReport int64         // when the previous report for the bucket arrived
	lastDemand int64         // when the bucket last had a request
	pace       time.Duration // time between two of its requests, smoothed (paceReport)
	interval   time.Duration // the report interval, estimated (observe)
	tbUntil    int64         // the live token bucket's end (sent.at + ttl), 0 if none
	nanos      int32         // fill_interval.nanos of the last token bucket sent

	// Follow-ups (docs/rlqs.md, "Between reports"): the bucket's id as last
	// reported, kept when it is at most maxFollowUpID bytes (nil otherwise: no
	// follow-ups); when the next one is due (Unix ns, 0 for none); and what the
	// last report asked for.
	id   *rlqsv3.BucketId
	due  int64
	want uint64
}

// report takes a usage report at now: it adds allowed to the counts and settles
// what can be settled, given margin (the longest one-way delay between the
// server and the Envoy, timer lateness included).
func (b *bucket) report(now int64, allowed uint64, margin time.Duration) {
	b.cover(now, allowed, margin)
	b.epochUsed += allowed
	b.unrecordedUsed += allowed
	b.settle(now, margin)
}

// admittable is the most the Envoy can have admitted in the bucket since its
// previous report, at now (before report and observe take this one): every unit
// of the assignments that were alive at some time since that report (a grant of g
// units is a token bucket that admits at most g over its whole life, tokensFor),
// and, on a rule that does not fail closed (whose Envoys admit with ALLOW_ALL
// between assignments) or on a bucket's first report on this stream (the Envoy may
// still hold an assignment of an earlier stream), one window of the rule's limit
// and burst per window elapsed. A report of more than that is clamped to it: an
// Envoy cannot push a key's state further than a window of use ahead, however
// large a number it sends.
func (b *bucket) admittable(now int64, cfg limit.Config, failOpen bool, margin time.Duration) uint64 {
	var elapsed time.Duration
	if b.lastReport > 0 && now > b.lastReport {
		elapsed = time.Duration(now - b.lastReport)
	}
	var n uint64
	for i, c := range b.credits {
		if diesAt(b.credits, i)+2*int64(margin) > b.lastReport {
			n += c.units
		}
	}
	if failOpen || b.lastReport == 0 {
		w := cfg.Window
		if cfg.CalendarDay || w <= 0 {
			w = limit.CalendarDayWindow
		}
		windows := 1 + uint64(elapsed/w)
		per := cfg.Limit + cfg.Burst
		if windows > sq.MaxUnits/max(per, 1) {
			return sq.MaxUnits
		}
		n += per * windows
	}
	return min(n, sq.MaxUnits)
}

// paceReport folds a report of d requests at now into the bucket's pace, the
// time between two of its requests: the time since the last report with requests
// divided by d, smoothed as observe smooths the interval. The bucket's first
// report (Envoy sends it at the bucket's first request) only starts the clock:
// its pace is measured from the next report with requests, which replaces the
// unknown (0) at once, so a bucket whose requests come seconds apart gets
// assignments that last until its next request from its second report on. A
// report without requests leaves it.
func (b *bucket) paceReport(d uint64, now int64) {
	if d == 0 || b.lastDemand == 0 || now <= b.lastDemand {
		return
	}
	p := time.Duration(now-b.lastDemand) / time.Duration(min(d, 1<<30))
	if b.pace == 0 {
		b.pace = p
		return
	}
	b.pace = (3*b.pace + p) / 4
}

// settle moves into settled the grants that can no longer be spent and whose
// spending every later report covers: a grant sent at s with TTL t, followed by an
// action sent at s', is dead by min(s+t, s') + margin (it reaches the Envoy at most
// margin late), and a report that arrives after that + margin was sent after it died.
func (b *bucket) settle(now int64, margin time.Duration) {
	n := 0
	for i, p := range b.pending {
		if now < diesAt(b.pending, i)+2*int64(margin) {
			break
		}
		b.settled += p.units
		n++
	}
	b.pending = b.pending[n:]
}

// action is an action sent for a bucket (sent, or a credit's), in the order sent.
type action interface{ sentAt() (at, ttl int64) }

func (s sent) sentAt() (int64, int64)   { return s.at, s.ttl }
func (c credit) sentAt() (int64, int64) { return c.at, c.ttl }

// diesAt is when action i of xs stops being spendable: its TTL's end, or when the
// next action was sent (Envoy replaces an assignment with the next), whichever is
// first.
func diesAt[T action](xs []T, i int) int64 {
	at, ttl := xs[i].sentAt()
	dies := at + ttl
	if i+1 < len(xs) {
		next, _ := xs[i+1].sentAt()
		dies = min(dies, next)
	}
	return dies
}

// toReturn is the units of settled grants this epoch that were certainly not spent
// and have not been returned: settled − reported this epoch − returned. Reports
// this epoch may include spending of earlier epochs or of grants not yet
// settled, which only makes it smaller.
func (b *bucket) toReturn() uint64 {
	spent := b.epochUsed + b.returned
	if b.settled <= spent {
		return 0
	}
	return b.settled - spent
}

// credit is an assignment sent, as coverage: its units no report spent yet,
// counted twice, for the two uses that err in opposite directions.
type credit struct {
	units uint64
	// left is what it can still cover of reported use (cover): spent oldest
	// assignment first, so that it is never short for use a grant paid for.
	left uint64
	// held is what the Envoy may at most still hold of it (keep): every unit
	// reported since it was sent is taken from it, whichever assignment admitted
	// it, so that a grant is never withheld for units the Envoy no longer holds.
	held    uint64
	at, ttl int64 // as sent's
}

// cover spends a report's allowed units from the assignments that may have
// admitted them and adds what none covers to owed. A report counts what the
// Envoy admitted since its previous report (b.lastReport, not yet moved to now),
// so every assignment alive at some moment since then may have: those still live,
// and those that died since. An assignment sent at s with TTL t, followed by
// another sent at s', is dead by min(s+t, s') plus margin at the Envoy; a report
// that arrives after that plus margin was sent after it died (settle's rule), so
// it can cover no later report, and it is dropped after this one with its units
// left: units granted and then returned, or forfeited when their window ended,
// are never coverage for later use. They are spent oldest first: an assignment
// replaced between two reports may have admitted all of the report (a late
// replacement), and spending the new one for it would leave the new one short
// for what it admits next, which would then be charged although its grant
// counted it already. Each report is also taken whole from what the live
// assignment may still hold (credit.held, keep).
func (b *bucket) cover(now int64, allowed uint64, margin time.Duration) {
	if n := len(b.credits); n > 0 {
		last := &b.credits[n-1]
		last.held -= min(last.held, allowed)
	}
	dead := 0
	for i := range b.credits {
		dies := diesAt(b.credits, i) + 2*int64(margin)
		if now >= dies {
			dead = i + 1
		}
		if now < dies || dies > b.lastReport {
			allowed = b.credits[i].spend(allowed)
		}
	}
	b.credits = b.credits[dead:]
	b.owed = min(b.owed+allowed, sq.MaxUnits)
}

// spend takes up to units from what c has left and returns the units it could
// not cover.
func (c *credit) spend(units uint64) uint64 {
	take := min(units, c.left)
	c.left -= take
	return units - take
}

// keep is the units the live token bucket may still hold: the last assignment
// sent, while it lives, less what it may have admitted since it was sent (0 when
// it ended, was a DENY_ALL, or none was sent). That is every unit reported since
// it was sent, whichever assignment admitted them, but no more than the requests
// the bucket's pace brings in the time since (a report that straddles the
// assignment's start counts the old one's too); before any report since, those
// requests. A grant of no more
// than that would replace it for nothing (quota.Assignment.Keep).
func (b *bucket) keep(now int64) uint64 {
	if len(b.credits) == 0 || b.tbUntil <= now {
		return 0
	}
	c := b.credits[len(b.credits)-1]
	spent := c.units - c.held
	if b.pace > 0 && now > c.at {
		paced := uint64(min(time.Duration(now-c.at)/b.pace, 1<<40))
		if b.lastReport > c.at {
			spent = min(spent, paced)
		} else {
			spent = paced // no report yet since it was sent
		}
	}
	return c.units - min(spent, c.units)
}

// toCharge is the units reported allowed that no live assignment covered and
// that are not charged yet: admitted without a grant (an Envoy's ALLOW_ALL
// fallbacks, before its first assignment or after one expired).
func (b *bucket) toCharge() uint64 { return b.owed }

// newEpoch starts counting returns afresh for the window or slot tag: the units of
// earlier epochs belong to counts already reset, so they are never returned.
func (b *bucket) newEpoch(tag uint64) {
	b.tag = tag
	b.pending = b.pending[:0]
	b.settled, b.epochUsed, b.returned = 0, 0, 0
}

// refillPeriod is the fill_interval of every token bucket sent: the bucket refills
// its max_tokens once per minute. It keeps max_tokens/fill_rate, the time Envoy
// backdates a new bucket by to start it full, at one minute whatever the grant:
// Envoy starts a bucket empty when that exceeds its monotonic clock (the host's
// uptime), and clamps fill rates below one token a year.
const refillPeriod = 60 * time.Second

// tokensFor returns the largest max_tokens M whose assignment, alive for less than
// ttl+1 s, lets Envoy admit at most units: a full bucket of M that refills M per
// refillPeriod admits at most M + ⌈M·life/refillPeriod⌉ − 1 (reserved).
func tokensFor(units uint64, ttl time.Duration) uint64 {
	life := uint64((ttl + time.Second) / time.Second)
	p := uint64(refillPeriod / time.Second)
	m := units * p / (p + life)
	for m+1 <= units && reserved(m+1, life, p) <= units {
		m++
	}
	for m > 0 && reserved(m, life, p) > units {
		m--
	}
	return min(m, 1<<32-1)
}

// reserved is the most a full bucket of m tokens, refilling m per p seconds,
// can admit while alive for less than life seconds: m, and the whole tokens
// refilled before life, the largest integer below m·life/p, which is
// ⌈m·life/p⌉ − 1 (one token fewer than ⌊m·life/p⌋ when m·life is a multiple
// of p: the last of those would come at life, too late).
func reserved(m, life, p uint64) uint64 {
	if m == 0 {
		return 0
	}
	return m + (m*life+p-1)/p - 1
}
