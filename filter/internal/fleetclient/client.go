// Package fleetclient is one worker's client of the quota service for
// fleet-scoped rules: the records of the counter keys the worker asks for, the
// batched quota calls (asks, reports and returns, cut by size), the edits of
// the lease table in shared data that go with them, and what an answer does to
// the leases and to the requests waiting on them.
//
// It holds no request state (a request's rounds and pending rules live on the
// request) and makes no hostcall itself: shared data and HTTP calls go through
// Host, so it runs, and is tested, natively. The plugin decides requests from
// the lease (package fleet) and calls it when a key has no quota, on each tick,
// when the policy changes and when the plugin ends.
//
// The protocol is package shared/quota's; the units taken out of a lease for a
// report are never reported unless the lease edit that took them was written,
// and a key the service answers quota.StatusRetry gets back what the report
// took (see Restore), so that units are neither spent twice nor lost.
package fleetclient

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/quota"
)

// Host is what the client needs of the proxy: proxy-wasm shared data (ABI
// v0.2.1 proxy_get_shared_data / proxy_set_shared_data, with the error values
// of package proxywasm: ErrNotFound for a missing key, ErrCasMismatch for a
// lost compare-and-swap) and one HTTP call to the quota service.
type Host interface {
	// GetSharedData returns the value of key and its CAS token.
	GetSharedData(key string) (value []byte, cas uint32, err error)
	// SetSharedData writes value if key's CAS token is still cas (CASAbsent
	// for a key that was absent when read).
	SetSharedData(key string, value []byte, cas uint32) error
	// Call POSTs body to the quota service (quota.Path) with the given timeout
	// and calls onAnswer once with the answer: the HTTP status ("" when there
	// was none: timeout, reset, no cluster) and the body (nil when unreadable
	// or over maxAnswerBytes). An error means the call was not dispatched and
	// onAnswer is never called.
	Call(body []byte, timeout time.Duration, onAnswer func(status string, body []byte)) error
	// Debug logs a debug message.
	Debug(msg string)
	// Now is the host's clock, Unix ns.
	Now() int64
}

// CASAbsent is the cas passed when writing a key that was absent when read:
// Envoy creates a new key whatever the cas, and a non-zero cas makes the write
// fail with CAS_MISMATCH if another VM created the key in between (cas 0 would
// overwrite it).
const CASAbsent = ^uint32(0)

// Counter is a metric the client adds to (the plugin's counters: flushed to
// Envoy's stats on tick).
type Counter interface{ Increment(n uint64) }

// Metrics are the client's counters; nil ones count nothing.
type Metrics struct {
	// Calls: quota calls dispatched. Failures: calls not dispatched or not
	// answered 200. BadAnswers: 200 answers that were malformed or did not
	// match the request. Refused: keys answered refused. Retried: keys
	// answered retry. Unapplied: grants whose lease edit failed and wait to be
	// applied on the next tick. Evictions: lease entries evicted.
	Calls, Failures, BadAnswers, Refused, Retried, Unapplied, Evictions Counter
	// CASRetries and CASExhausted: lease edits that lost a compare-and-swap, and
	// that gave up.
	CASRetries, CASExhausted Counter
}

func inc(c Counter, n uint64) {
	if c != nil && n > 0 {
		c.Increment(n)
	}
}

// Config is the client's part of the filter configuration.
type Config struct {
	// Interval is quota_interval: how often keys are reported and topped up.
	Interval time.Duration
	// Timeout is quota_timeout: how long a quota call may take.
	Timeout time.Duration
	// Tick is the plugin's tick period; a call unanswered Timeout + 2 ticks
	// after it was sent is failed.
	Tick time.Duration
	// EntriesPerBucket bounds a lease bucket (fleet.Put's max).
	EntriesPerBucket int
	// CASRetries is the compare-and-swap retry budget of a lease edit; at least
	// MinModifyRetries is used.
	CASRetries int
	// MaxBytes bounds one quota request document (default quota.DefaultMaxBytes,
	// the service's default limit); a report larger than that is cut into
	// several calls.
	MaxBytes int
	// MaxKeys bounds the keys of one quota request (default quota.DefaultMaxKeys).
	MaxKeys int
}

// Rule is what the client needs of a fleet rule of the policy in use.
type Rule struct {
	// LeaseKeys are the shared-data keys of its lease buckets.
	LeaseKeys []string
	// Fingerprint is its rules.CompiledRule.Fingerprint; a lease entry of
	// another fingerprint reads as absent.
	Fingerprint uint64
	// StatusKey is the shared-data key where the workers keep what the
	// service last told any of them of the rule's keys (see serviceStatus):
	// how many Envoys share them, so that every worker divides the limit by it
	// when cut off, and when it last answered, so that a worker degraded for
	// want of an answer asks again as soon as another was answered; "" keeps
	// both per worker.
	StatusKey string
	// Windowed: a fixed_window or time_wheel rule, whose leases end with the
	// window or slot. Its keys are topped up when a lease holds less than twice
	// what the worker saw used since its own last report, at reports only: the
	// window's fair shares are divided among the Envoys that ask, and a worker
	// asking at the Envoy's rate, or between reports, took the shares of slower
	// Envoys. The buckets' leases are judged at the Envoy's rate (runsLow,
	// followUp).
	Windowed bool
}

// Policy is the policy in use, as the quota request names it.
type Policy struct {
	// Name and Version are the policy's name and version (the request's
	// "policy" and "version"); Env is the filter's env ("env"), which the
	// service compiles the policy for.
	Name    string
	Version uint64
	Env     string
	// Rule returns the fleet rule of that id, false when the policy has none
	// (removed, or envoy-scoped now).
	Rule func(id string) (Rule, bool)
}

// Constants of the client.
const (
	// MaxKeys bounds the keys a worker remembers.
	MaxKeys = 4096
	// MaxKeyWaiters bounds the requests waiting on one key in a worker; more
	// are decided as on_quota_failure says.
	MaxKeyWaiters = 4096
	// MinWant is the fewest units a worker asks for a key, and what it asks
	// for a key it was never granted (more if more requests wait on it).
	MinWant = 16
	// SizedWant is what a worker asks for a key it was granted before: the
	// service sizes the grant from the reported use (a little more than one
	// quota_interval's worth, capped at a share of what is left), so the ask
	// only bounds it.
	SizedWant = 1 << 20
	// MinModifyRetries is the least CAS retry budget of a lease edit: losing
	// one loses units (a grant) or would report what was not taken out.
	MinModifyRetries = 64
	// idleIntervals: a key not used for this many intervals is forgotten.
	idleIntervals = 10
	// maxKeepBytes: a request buffer grown past this is not kept.
	maxKeepBytes = 64 << 10
)

// Waiter is a request paused until its key's quota call is answered: Stream
// is the plugin's stream (its HTTP context), Seq the request's wait number
// (a waiter whose request no longer carries Seq is stale and skipped).
type Waiter struct {
	Stream any
	Seq    uint64
}

// Key is what a worker knows of one counter key of a fleet rule.
type Key struct {
	// Key is the counter key, RuleID its rule, Hash its hash in the lease
	// table and Bucket its lease bucket.
	Key    string
	RuleID string
	Hash   uint64
	Bucket int
	// Waiters are the requests waiting for this key's call.
	Waiters []Waiter
	// Want is the units the waiting requests need (added by the plugin).
	Want uint64
	// RefusedUntil: the service refused the key (its budget is spent) until
	// then, Unix ns; RetryAfter is the service's retry-after of that refusal.
	RefusedUntil int64
	RetryAfter   time.Duration
	// FailedUntil: the key degrades (on_quota_failure) until then, Unix ns,
	// because the service could not be asked, failed, or answered retry; the
	// next ask is after it.
	FailedUntil int64
	// unreachedAt is when the key's last call found no service (no answer,
	// a non-200 status, a call not dispatched), Unix ns; 0 when FailedUntil
	// comes from an answer (retry, a policy mismatch) or is over.
	unreachedAt int64
	// Envoys is how many Envoys shared the key at the service's last answer
	// (quota.KeyResult.Envoys), 0 until one said.
	Envoys uint32

	call     *call
	lastSeen int64
	granted  bool // granted before: the service has use history to size from
	// unapplied is a grant whose lease edit failed: applied on the next tick.
	unapplied *grant
}

// Asking reports whether a call asking for the key is in flight.
func (k *Key) Asking() bool { return k.call != nil }

type grant struct {
	units     uint64
	expiresIn time.Duration
	sent      int64
	// fresh: the service's entry holds only this grant (held == granted), so any
	// units still in the lease are not part of it and must not take its expiry.
	fresh bool
}

// call is one quota request in flight.
type call struct {
	keys     []*Key
	items    []item // per key: what the report took out of the lease
	sent     int64
	deadline int64
	done     bool
}

// item is what one key's report took out of its lease.
type item struct {
	kind       Kind
	used, back uint64
	leaseSent  int64 // the Sent of the lease the returned units were taken from
	asked      bool  // the call asks for the key (k.call == this call)
	// charge is the units admitted without a lease the report books
	// (fleet.Entry.Charge), lapsing at chargeUntil.
	charge      uint64
	chargeUntil int64
}

// Kind is what a report does for a key.
type Kind uint8

// Kinds of report.
const (
	Ask    Kind = iota // report use and ask for units
	Return             // report use and return the held units
	Report             // report use only
)

// Client is one worker's quota client.
type Client struct {
	// Envoy is this Envoy's id for the service (set by the plugin before the
	// first call).
	Envoy string
	// Resume re-decides the requests waiting on k (they continue, are
	// answered, or wait again); it is called after k's call was answered.
	Resume func(k *Key)
	// Policy returns the policy in use, nil when there is none. An answer is
	// applied under the policy in use when it arrives.
	Policy func() *Policy

	host       Host
	cfg        Config
	m          Metrics
	keys       map[string]*Key
	calls      map[*call]struct{}
	orphans    []*Key
	ruleEnvoys map[string]uint32 // by rule id: the Envoys of the last answer for any of its keys

	// charges: an answer of the service said it books charges
	// (quota.Response.Charges); until then none is sent.
	charges    bool
	nextReport int64
	buf, mod   []byte
	// followBuckets are the lease buckets a followUp pass read, by key, their
	// bytes copies in followBuf (both reused from pass to pass).
	followBuckets map[string][]byte
	followBuf     []byte
}

// New returns a client.
func New(host Host, cfg Config, m Metrics) *Client {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = quota.DefaultMaxBytes
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = quota.DefaultMaxKeys
	}
	return &Client{host: host, cfg: cfg, m: m, keys: map[string]*Key{}, calls: map[*call]struct{}{}, ruleEnvoys: map[string]uint32{},
		followBuckets: map[string][]byte{}}
}

// Envoys returns how many Envoys share a key of rule ruleID as the service last
// said: of k itself when it said to this worker (k may be nil), else of any key
// of the rule as the last answer to any worker of the Envoy said (the rule's
// StatusKey in shared data), else of the rule's key this worker last heard of,
// else 0 (unknown). The plugin divides the limit by it when the service cannot
// be reached (on_quota_failure "local").
func (c *Client) Envoys(ruleID string, k *Key) uint32 {
	if k != nil && k.Envoys > 0 {
		return k.Envoys
	}
	if st, ok := c.status(ruleID); ok && st.envoys > 0 {
		return st.envoys
	}
	return c.ruleEnvoys[ruleID]
}

// Reachable reports whether k, degraded because its last call found no
// service, may ask again now: a worker of the Envoy was answered for a key of
// its rule since. It then ends k's degraded interval.
func (c *Client) Reachable(k *Key) bool {
	if k.unreachedAt == 0 {
		return false
	}
	st, ok := c.status(k.RuleID)
	if !ok || st.answeredAt <= k.unreachedAt || c.host.Now() < st.holdUntil {
		return false
	}
	k.FailedUntil, k.unreachedAt = 0, 0
	return true
}

// Held reports whether the keys of rule ruleID are held degraded at now, and
// until when: a worker of the Envoy booked a charge (units admitted without a
// lease) less than chargeHold intervals ago, and the answer counted fewer
// Envoys on the key than before (lostOthers): the store lost the key's count,
// and the fresh count holds only the charges booked so far. The other Envoys'
// charges reach the service within a report interval of their reconnecting;
// until they have, a grant would count on budget they already spent. So the
// Envoy asks for no units meanwhile and decides as the rule's on_quota_failure
// says (what it admits is charged too).
func (c *Client) Held(ruleID string, now int64) (until int64, held bool) {
	st, ok := c.status(ruleID)
	if !ok || now >= st.holdUntil {
		return 0, false
	}
	return st.holdUntil, true
}

// chargeHold is how long, in report intervals, an Envoy that booked a charge
// asks for no units (Held).
const chargeHold = 2

// mayHold reports whether a charge booked at now starts a hold of rule
// ruleID's keys: not while one runs, nor within a hold's length after it ended,
// so that what the keys admit by themselves during a hold (charged when it is
// booked) does not renew it for as long as traffic lasts.
func (c *Client) mayHold(ruleID string, now int64) bool {
	st, ok := c.status(ruleID)
	return !ok || st.holdUntil == 0 || now >= st.holdUntil+chargeHold*int64(c.cfg.Interval)
}

// serviceStatus is what the service last told any worker of the Envoy of a
// rule's keys, kept in shared data under the rule's StatusKey, 24 bytes
// little-endian: envoys u32 | zero u32 | answered_at i64 | hold_until i64.
type serviceStatus struct {
	envoys     uint32 // Envoys sharing a key of the rule (KeyResult.Envoys); 0 unknown
	answeredAt int64  // when an answer last came, Unix ns
	holdUntil  int64  // until when its keys ask for no units (Held), Unix ns
}

// The encoded serviceStatus's fields, each at its offset; the size follows.
const (
	offStEnvoys       = 0
	offStAnswered     = 8
	offStHold         = 16
	serviceStatusSize = 24
)

// status reads rule ruleID's serviceStatus; false when there is none.
func (c *Client) status(ruleID string) (serviceStatus, bool) {
	pol := c.policy()
	if pol == nil || pol.Rule == nil {
		return serviceStatus{}, false
	}
	r, ok := pol.Rule(ruleID)
	if !ok || r.StatusKey == "" {
		return serviceStatus{}, false
	}
	v, _, err := c.host.GetSharedData(r.StatusKey)
	if err != nil || len(v) != serviceStatusSize {
		return serviceStatus{}, false
	}
	le := binary.LittleEndian
	return serviceStatus{envoys: le.Uint32(v[offStEnvoys:]), answeredAt: int64(le.Uint64(v[offStAnswered:])), holdUntil: int64(le.Uint64(v[offStHold:]))}, true
}

// noteAnswer writes to r's StatusKey that the service answered at now, the
// count of Envoys it said (0: keep the one there) and, when hold is later than
// the one there, that the rule's keys are held until hold (Held). An
// unconditional write: the last answer wins.
func (c *Client) noteAnswer(r Rule, envoys uint32, now, hold int64) {
	if r.StatusKey == "" {
		return
	}
	le := binary.LittleEndian
	if v, _, err := c.host.GetSharedData(r.StatusKey); err == nil && len(v) == serviceStatusSize {
		if envoys == 0 {
			envoys = le.Uint32(v[offStEnvoys:])
		}
		hold = max(hold, int64(le.Uint64(v[offStHold:])))
	}
	var v [serviceStatusSize]byte
	le.PutUint32(v[offStEnvoys:], envoys)
	le.PutUint64(v[offStAnswered:], uint64(now))
	le.PutUint64(v[offStHold:], uint64(hold))
	_ = c.host.SetSharedData(r.StatusKey, v[:], 0)
}

// SetConfig replaces the configuration (a new plugin configuration).
func (c *Client) SetConfig(cfg Config) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = quota.DefaultMaxBytes
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = quota.DefaultMaxKeys
	}
	c.cfg = cfg
}

// Lookup returns the record of key (a view is fine: it is not kept), nil if
// the worker has none.
func (c *Client) Lookup(key string) *Key { return c.keys[key] }

// Len returns the number of keys the worker remembers.
func (c *Client) Len() int { return len(c.keys) }

// KeyFor returns the record of key, creating it (key is copied); nil if the key
// is longer than quota.MaxKeyBytes (the service would refuse the whole batch
// for it) or if MaxKeys are remembered and none can be dropped.
func (c *Client) KeyFor(key []byte, ruleID string, hash uint64, bucket int, now int64) *Key {
	if k := c.keys[string(key)]; k != nil { // no allocation: a map lookup by string(bytes)
		k.lastSeen = now
		return k
	}
	if len(key) > quota.MaxKeyBytes {
		return nil
	}
	if len(c.keys) >= MaxKeys {
		c.forgetIdle(now, true)
		if len(c.keys) >= MaxKeys {
			return nil
		}
	}
	k := &Key{Key: string(key), RuleID: ruleID, Hash: hash, Bucket: bucket, lastSeen: now}
	c.keys[k.Key] = k
	return k
}

// forgetIdle drops records of keys with no call, no waiters, no unapplied
// grant and no use for idleIntervals (any such key when force).
func (c *Client) forgetIdle(now int64, force bool) {
	idle := now - idleIntervals*int64(c.cfg.Interval)
	for name, k := range c.keys {
		if k.call == nil && len(k.Waiters) == 0 && k.unapplied == nil && (force || k.lastSeen < idle) &&
			k.RefusedUntil < now && k.FailedUntil < now {
			delete(c.keys, name)
		}
	}
}

// ModifyLease applies f to the entry of hash in lease bucket key by read → f →
// CAS write, retrying up to max(Config.CASRetries, MinModifyRetries) times. f
// gets the entry (found reports whether it existed) and returns false to write
// nothing. It reports whether f's change is in shared data (true also when f
// wrote nothing); on false nothing f did was written.
func (c *Client) ModifyLease(key string, hash uint64, now int64, f func(e *fleet.Entry, found bool) bool) bool {
	for attempt := 0; ; attempt++ {
		value, cas, err := c.host.GetSharedData(key)
		switch {
		case errors.Is(err, proxywasm.ErrNotFound):
			value, cas = nil, CASAbsent
		case err != nil:
			return false
		}
		e, _, found := fleet.Find(value, hash)
		if !found {
			e = fleet.Entry{Hash: hash}
		}
		if !f(&e, found) {
			return true
		}
		out, evicted := fleet.Put(c.mod[:0], value, e, c.cfg.EntriesPerBucket, now)
		c.mod = out[:0]
		err = c.host.SetSharedData(key, out, cas)
		if err == nil {
			if evicted {
				inc(c.m.Evictions, 1)
			}
			return true
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			return false
		}
		inc(c.m.CASRetries, 1)
		if attempt >= max(c.cfg.CASRetries, MinModifyRetries) {
			inc(c.m.CASExhausted, 1)
			return false
		}
	}
}

// policy returns the policy in use, nil when there is none.
func (c *Client) policy() *Policy {
	if c.Policy == nil {
		return nil
	}
	return c.Policy()
}
