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
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
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
	nextReport int64
	buf, mod   []byte
}

// New returns a client.
func New(host Host, cfg Config, m Metrics) *Client {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = quota.DefaultMaxBytes
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = quota.DefaultMaxKeys
	}
	return &Client{host: host, cfg: cfg, m: m, keys: map[string]*Key{}, calls: map[*call]struct{}{}, ruleEnvoys: map[string]uint32{}}
}

// Envoys returns how many Envoys share a key of rule ruleID as the service last
// said: of k itself when it said (k may be nil), else of the rule's key it last
// answered for, else 0 (unknown). The plugin divides the limit by it when the
// service cannot be reached (on_quota_failure "local").
func (c *Client) Envoys(ruleID string, k *Key) uint32 {
	if k != nil && k.Envoys > 0 {
		return k.Envoys
	}
	return c.ruleEnvoys[ruleID]
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

// Ask asks the service for keys (reporting their use) in as few calls as
// their size allows; false if a call could not be dispatched (its keys then
// degrade for an interval).
func (c *Client) Ask(keys []*Key, now int64) bool {
	return c.send(c.policy(), keys, nil, now)
}

func (c *Client) policy() *Policy {
	if c.Policy == nil {
		return nil
	}
	return c.Policy()
}

// Tick ends calls whose answer never came, re-decides the waiters of keys a
// policy change dropped, applies grants whose lease edit failed, and, once per
// quota interval, reports use, tops up leases running low and returns the
// units of idle keys, in as few calls as their size allows. With no policy
// nothing is reported.
func (c *Client) Tick(now int64) {
	pol := c.policy()
	if orphans := c.orphans; len(orphans) > 0 {
		c.orphans = nil
		for _, k := range orphans {
			c.resume(k)
		}
	}
	for cl := range c.calls {
		if now > cl.deadline {
			c.finish(cl, nil, now)
		}
	}
	if pol == nil {
		return
	}
	for _, k := range c.keys {
		if k.unapplied != nil {
			if r, ok := pol.Rule(k.RuleID); ok {
				c.applyGrant(k, r, now)
			} else {
				k.unapplied = nil
			}
		}
	}
	interval := int64(c.cfg.Interval)
	if c.nextReport == 0 {
		// The first report is an interval after the first tick with a policy,
		// however late that tick runs: what was used before it is reported then.
		c.nextReport = now + interval
	}
	if now < c.nextReport {
		return
	}
	c.nextReport = now + interval
	var keys []*Key
	var kinds []Kind
	for _, k := range c.keys {
		if k.call != nil {
			continue
		}
		r, ok := pol.Rule(k.RuleID)
		if !ok {
			delete(c.keys, k.Key)
			continue
		}
		value, _, err := c.host.GetSharedData(r.LeaseKeys[k.Bucket])
		if err != nil {
			continue
		}
		e, _, found := fleet.Find(value, k.Hash)
		if !found || e.Fingerprint != r.Fingerprint {
			continue
		}
		// Requests spending from the lease never touch the record: the lease
		// says when the key was last used.
		k.lastSeen = max(k.lastSeen, e.LastUse)
		live := e.Live(r.Fingerprint, now)
		switch {
		case live > 0 && now-e.LastUse > 3*interval:
			// Idle: give the units back; its next ask starts small again
			// (the service may have forgotten its use by then).
			k.granted = false
			keys, kinds = append(keys, k), append(kinds, Return)
		case now-e.LastUse <= 2*interval && e.Claim <= now && k.RefusedUntil <= now &&
			(live <= 2*e.Used || e.Expiry-now <= 2*interval):
			k.Want = max(k.Want, 2*e.Used)
			keys, kinds = append(keys, k), append(kinds, Ask)
		case e.Used > 0:
			keys, kinds = append(keys, k), append(kinds, Report)
		}
	}
	if len(keys) > 0 {
		c.send(pol, keys, kinds, now)
	}
	c.forgetIdle(now, false)
}

// PolicyChanged drops the records of keys whose rule the new policy removed,
// made envoy-scoped or changed (same(id) false: their leases are void, as an
// entry of another fingerprint reads as absent); the next Tick re-decides
// their waiters under the new policy. Their units are not returned: the service
// answers a report under the old version stale_policy, and under the new one
// the rule's key is another lease; it gets them back when the lease ends.
func (c *Client) PolicyChanged(same func(ruleID string) bool) {
	for name, k := range c.keys {
		if same(k.RuleID) {
			continue
		}
		delete(c.keys, name)
		k.call = nil
		c.orphans = append(c.orphans, k)
	}
}

// Done returns every unused unit the worker's keys hold, as the plugin goes
// away (Envoy may not deliver the answer; nothing waits on it).
func (c *Client) Done(now int64) {
	pol := c.policy()
	if pol == nil || len(c.keys) == 0 {
		return
	}
	keys := make([]*Key, 0, len(c.keys))
	kinds := make([]Kind, 0, len(c.keys))
	for _, k := range c.keys {
		keys, kinds = append(keys, k), append(kinds, Return)
	}
	c.send(pol, keys, kinds, now)
}

// send reports on keys (kinds nil: Ask for all) in calls of at most MaxKeys
// keys and MaxBytes bytes each; false if one could not be dispatched.
func (c *Client) send(pol *Policy, keys []*Key, kinds []Kind, now int64) bool {
	if pol == nil || len(keys) == 0 {
		return true
	}
	timeout := int64(c.cfg.Timeout)
	cl := &call{sent: now, deadline: now + timeout + 2*int64(c.cfg.Tick)}
	var reqs []quota.KeyRequest
	for i, k := range keys {
		r, ok := pol.Rule(k.RuleID)
		if !ok {
			continue
		}
		kind := Ask
		if kinds != nil {
			kind = kinds[i]
		}
		it := item{kind: kind}
		fp := r.Fingerprint
		var used, back uint64
		var leaseSent int64
		written := c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
			used, back, leaseSent = 0, 0, e.Sent
			if !found {
				return false
			}
			used = e.Used
			e.Used = 0
			switch kind {
			case Return:
				back = e.Live(fp, now)
				e.Held = 0
			case Ask:
				e.Claim = now + timeout
			}
			return true
		})
		if written {
			it.used, it.back, it.leaseSent = used, back, leaseSent
		} // else nothing was taken out of the lease: report nothing, return nothing
		want := uint64(0)
		if kind == Ask {
			want = max(k.Want, 2*it.used, MinWant)
			if k.granted {
				want = max(want, SizedWant)
			}
			want = min(want, quota.MaxUnits)
		}
		if kind != Ask && it.used == 0 && it.back == 0 {
			continue // nothing to say
		}
		k.Want = 0
		reqs = append(reqs, quota.KeyRequest{Rule: k.RuleID, Key: k.Key, Used: min(it.used, quota.MaxUnits), Return: min(it.back, quota.MaxUnits), Want: want})
		if kind == Ask {
			it.asked = true
			k.call = cl
		}
		cl.keys = append(cl.keys, k)
		cl.items = append(cl.items, it)
	}
	if len(reqs) == 0 {
		return true
	}
	base := quota.Request{Envoy: c.Envoy, Policy: pol.Name, Version: pol.Version, Env: pol.Env, Interval: c.cfg.Interval}
	ok := true
	for _, part := range c.cut(&base, reqs) {
		sub := &call{sent: cl.sent, deadline: cl.deadline, keys: cl.keys[part.from:part.to], items: cl.items[part.from:part.to]}
		for j, k := range sub.keys {
			if sub.items[j].asked {
				k.call = sub
			}
		}
		base.Keys = reqs[part.from:part.to]
		if !c.dispatch(pol, sub, &base, now) {
			ok = false
		}
	}
	return ok
}

type span struct{ from, to int }

// cut splits reqs into runs of at most MaxKeys keys whose request documents
// (base with those keys) encode to at most MaxBytes. A key too large to fit
// even alone (it cannot be: keys are at most quota.MaxKeyBytes) would travel
// alone and be refused alone.
func (c *Client) cut(base *quota.Request, reqs []quota.KeyRequest) []span {
	var out []span
	var stack []span
	stack = append(stack, span{0, len(reqs)})
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := s.to - s.from
		if n > 1 && (n > c.cfg.MaxKeys || c.size(base, reqs[s.from:s.to]) > c.cfg.MaxBytes) {
			mid := s.from + n/2
			stack = append(stack, span{mid, s.to}, span{s.from, mid}) // first half on top: keeps order
			continue
		}
		out = append(out, s)
	}
	return out
}

func (c *Client) size(base *quota.Request, keys []quota.KeyRequest) int {
	base.Keys = keys
	c.buf = quota.AppendRequest(c.buf[:0], base)
	return len(c.buf)
}

// dispatch sends one call; on failure its keys degrade for an interval and
// what the report took out of the leases is restored.
func (c *Client) dispatch(pol *Policy, cl *call, req *quota.Request, now int64) bool {
	c.buf = quota.AppendRequest(c.buf[:0], req)
	inc(c.m.Calls, 1)
	err := c.host.Call(c.buf, c.cfg.Timeout, func(status string, body []byte) { c.answer(cl, status, body) })
	if cap(c.buf) > maxKeepBytes {
		c.buf = nil
	}
	if err != nil {
		c.host.Debug("sluice: quota call: " + err.Error())
		inc(c.m.Failures, 1)
		cl.done = true
		for j, k := range cl.keys {
			if k.call == cl {
				k.call = nil
			}
			k.FailedUntil = now + int64(c.cfg.Interval)
			// Never sent: nothing was recorded, so what the report took goes back.
			if r, ok := pol.Rule(k.RuleID); ok {
				c.restore(k, r, cl.items[j], now)
			}
		}
		return false
	}
	c.calls[cl] = struct{}{}
	return true
}

// answer handles a call's answer.
func (c *Client) answer(cl *call, status string, body []byte) {
	if cl.done {
		return
	}
	var resp *quota.Response
	switch {
	case status == "":
	case status != "200":
		c.host.Debug("sluice: quota service answered " + status)
	case body == nil:
		inc(c.m.BadAnswers, 1)
		c.host.Debug("sluice: quota answer unreadable or too large")
	default:
		r, err := quota.DecodeResponse(body)
		switch {
		case err != nil:
			inc(c.m.BadAnswers, 1)
			c.host.Debug("sluice: malformed quota answer: " + err.Error())
		case !matches(r, cl):
			inc(c.m.BadAnswers, 1)
			c.host.Debug("sluice: quota answer does not match the request's keys")
		default:
			resp = r
		}
	}
	c.finish(cl, resp, c.host.Now())
}

func matches(r *quota.Response, cl *call) bool {
	if len(r.Keys) != len(cl.keys) {
		return false
	}
	for i, k := range cl.keys {
		if r.Keys[i].Key != k.Key {
			return false
		}
	}
	return true
}

// finish applies an answer (nil: the call failed) and resumes the waiters.
func (c *Client) finish(cl *call, resp *quota.Response, now int64) {
	pol := c.policy()
	cl.done = true
	delete(c.calls, cl)
	interval := int64(c.cfg.Interval)
	if resp == nil {
		inc(c.m.Failures, 1)
	}
	for i, k := range cl.keys {
		var r Rule
		ok := false
		if pol != nil && pol.Rule != nil {
			r, ok = pol.Rule(k.RuleID)
		}
		if resp != nil && resp.Keys[i].Status == quota.StatusRetry {
			// Nothing was recorded for the key: what the report took goes back.
			inc(c.m.Retried, 1)
			if ok {
				c.restore(k, r, cl.items[i], now)
			}
		}
		if resp != nil && resp.Keys[i].Envoys > 0 {
			// Reports answer it too: every key of the call learns the fleet's size.
			k.Envoys = resp.Keys[i].Envoys
			c.ruleEnvoys[k.RuleID] = k.Envoys
		}
		if k.call != cl {
			continue // not asked by this call
		}
		k.call = nil
		if resp == nil {
			k.FailedUntil = now + interval
			continue
		}
		if ok {
			c.apply(k, r, &resp.Keys[i], cl.sent, now)
		} else {
			k.FailedUntil = now + interval
		}
	}
	for _, k := range cl.keys {
		if k.call == nil { // not while another call for the key is in flight
			c.resume(k)
		}
	}
}

func (c *Client) resume(k *Key) {
	if c.Resume != nil && len(k.Waiters) > 0 {
		c.Resume(k)
	}
}

// restore puts back into the lease what a report took out when the service
// recorded nothing of it (quota.StatusRetry, or a call never sent): the used
// units are reported again next time, and returned units are held again if the
// very lease they were taken from is still live under the same rule (else they
// end with it, as the service's ledger says: a newer lease never gets them).
func (c *Client) restore(k *Key, r Rule, it item, now int64) {
	if it.used == 0 && it.back == 0 {
		return
	}
	fp := r.Fingerprint
	c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
		if !found || e.Fingerprint != fp {
			return false
		}
		e.Used += it.used
		if it.back > 0 && now < e.Expiry && e.Sent == it.leaseSent {
			e.Held += it.back
		}
		return true
	})
}

// apply applies one key's result: a grant goes into the lease; a refusal or a
// status that degrades the key is recorded.
func (c *Client) apply(k *Key, r Rule, res *quota.KeyResult, sent, now int64) {
	interval := int64(c.cfg.Interval)
	switch res.Status {
	case quota.StatusGranted, quota.StatusPartial:
		k.FailedUntil, k.RefusedUntil = 0, 0
		k.granted = k.granted || res.Granted > 0
		if res.Granted > 0 && res.ExpiresIn > 0 {
			c.applyGrant(k, r, now) // an earlier grant first, if one is waiting
			g := grant{units: res.Granted, expiresIn: res.ExpiresIn, sent: sent, fresh: res.Held <= res.Granted}
			if u := k.unapplied; u != nil {
				// Still not applied: both wait, ending with the earlier lease.
				end := min(u.sent+int64(u.expiresIn), sent+int64(res.ExpiresIn))
				g = grant{units: u.units + g.units, sent: max(u.sent, sent), fresh: g.fresh}
				g.expiresIn = time.Duration(end - g.sent)
			}
			k.unapplied = &g
			c.applyGrant(k, r, now)
		} else {
			fp := r.Fingerprint
			c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
				if !found || e.Fingerprint != fp || e.Claim == 0 {
					return false
				}
				e.Claim = 0 // answered: another worker may ask
				return true
			})
		}
		if res.Status == quota.StatusPartial && res.Granted == 0 {
			k.RefusedUntil = now + min(int64(res.RetryAfter), interval)
		}
	case quota.StatusRefused:
		inc(c.m.Refused, 1)
		ra := res.RetryAfter
		if ra <= 0 || ra == limit.Never {
			ra = time.Duration(interval)
		}
		k.RetryAfter = ra
		k.RefusedUntil = now + min(int64(ra), interval)
	case quota.StatusRetry:
		// The service could not decide in time: the lease stays as it is, the
		// key degrades (never denies for this) and is asked again soon.
		ra := res.RetryAfter
		if ra <= 0 {
			ra = time.Duration(interval)
		}
		k.FailedUntil = now + min(int64(ra), interval)
	default: // stale_policy, unknown_rule, not_fleet, bad_key
		c.host.Debug("sluice: quota service: key of rule " + k.RuleID + ": " + res.Status)
		k.FailedUntil = now + interval
	}
}

// applyGrant adds k's unapplied grant to its lease; if the edit fails the grant
// stays unapplied (counted) for the next tick, until it has expired. A fresh grant
// (the service's entry holds nothing else) replaces the lease instead: units the
// service no longer counts as this Envoy's (its entry was reclaimed, or a lease of
// an earlier call ended there) keep no place in a lease whose end they never had,
// so an old grant is never extended by a new answer.
func (c *Client) applyGrant(k *Key, r Rule, now int64) {
	g := k.unapplied
	if g == nil {
		return
	}
	expiry := g.sent + int64(g.expiresIn)
	if now >= expiry {
		k.unapplied = nil // the lease it belonged to is over: nothing to spend
		return
	}
	fp := r.Fingerprint
	ok := c.ModifyLease(r.LeaseKeys[k.Bucket], k.Hash, now, func(e *fleet.Entry, found bool) bool {
		e.Claim = 0
		if !found || e.Fingerprint != fp || now >= e.Expiry || g.fresh && g.sent >= e.Sent {
			*e = fleet.Entry{Hash: k.Hash, Fingerprint: fp, Used: e.Used, LastUse: e.LastUse}
			e.Held, e.Expiry, e.Sent = g.units, expiry, g.sent
			return true
		}
		e.Held += g.units
		if g.sent >= e.Sent {
			e.Expiry, e.Sent = expiry, g.sent
		} else {
			e.Expiry = min(e.Expiry, expiry)
		}
		return true
	})
	if ok {
		k.unapplied = nil
		return
	}
	inc(c.m.Unapplied, 1)
}
