package plugin

import (
	"errors"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleet"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/limit/table"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Fleet-scoped rules ("scope": "fleet"): a request spends from the quota
// lease this Envoy holds for its counter key, kept in shared data
// (package fleet) so that every worker spends from the same lease by CAS.
// A key without quota pauses the request and the worker asks the control
// plane's quota service (POST /v1/quota, package quota) once, however many of
// its requests wait on the key; the answer resumes them (each re-decided with
// its stream as the effective context) or denies them. On each
// quota_interval the worker reports use, tops up leases running low, and
// returns the unused units of idle keys, in one batched call. When the
// service cannot answer (no answer within quota_timeout, a non-200 status,
// an answer that does not decode), the rule degrades as its
// on_quota_failure says for one quota_interval.

// fleetMode is how a rule is enforced: per Envoy (fleetNone) or from leases,
// degrading as on_quota_failure says.
type fleetMode uint8

const (
	fleetNone fleetMode = iota
	fleetLocal
	fleetPass
	fleetDeny
)

// Fleet constants.
const (
	// maxQuotaRounds bounds how often one request waits for quota.
	maxQuotaRounds = 3
	// maxFleetKeys bounds the keys a worker remembers.
	maxFleetKeys = 4096
	// maxKeyWaiters bounds the requests waiting on one key in a worker; more
	// are decided as on_quota_failure says.
	maxKeyWaiters = 4096
	// maxQuotaAnswerBytes bounds the quota service's answer.
	maxQuotaAnswerBytes = 1 << 20
	// minWant is the fewest units a worker asks for a key, and what it asks
	// for a key it was never granted (more if more requests wait on it).
	minWant = 16
	// sizedWant is what a worker asks for a key it was granted before: the
	// service sizes the grant from the reported use (a little more than one
	// quota_interval's worth, capped at a share of what is left), so the ask
	// only bounds it.
	sizedWant = 1 << 20
	// reasonQuotaUnavailable is sluice.reason when a fleet rule degraded.
	reasonQuotaUnavailable = "quota_unavailable"
	quotaPath              = "/v1/quota"
)

var (
	propScope  = []string{"sluice.scope"}
	propQuota  = []string{"sluice.quota"}
	valFleet   = []byte("fleet")
	valLocal   = []byte("local")
	valWaited  = []byte("waited")
	valDegrade = []byte("degraded")
)

// fleetRule is a ruleState's fleet part.
type fleetRule struct {
	mode      fleetMode
	leaseKeys []string
}

// fleetEval is an eval's fleet part.
type fleetEval struct {
	lease    bool // decided from the lease: commit writes entry to the lease bucket
	skip     bool // nothing to write (pass, or a shadow rule without quota)
	pending  bool // no quota: the request waits for the service
	degraded bool // decided by on_quota_failure
	read     bool // readDecideFleet ran for this eval
	entry    fleet.Entry
}

// fleetReq is an httpContext's fleet part.
type fleetReq struct {
	id       uint32 // the stream's context id
	seq      uint64 // non-zero while waiting: matches the waiter entries
	rounds   int
	waited   bool
	degraded bool
}

// fleetWorker is a worker's fleet state.
type fleetWorker struct {
	envoy      string
	keys       map[string]*fleetKey
	seq        uint64
	pending    int
	nextReport int64
	// curRounds is the quota rounds of the request being decided.
	curRounds int
	calls     map[*quotaCall]struct{}
	// orphans are dropped keys whose waiters the next tick re-decides.
	orphans []*fleetKey
	buf     []byte
	m       fleetMetrics
}

// fleetKey is what a worker knows of one counter key of a fleet rule.
type fleetKey struct {
	key          string
	ruleID       string
	hash         uint64
	bucket       int
	waiters      []fleetWaiter
	call         *quotaCall
	want         uint64
	refusedUntil int64
	retryAfter   time.Duration
	failedUntil  int64
	lastSeen     int64
	// granted: the service granted units for this key before (it then has
	// use history to size grants from).
	granted bool
}

type fleetWaiter struct {
	h   *httpContext
	seq uint64
}

// quotaCall is one quota request in flight.
type quotaCall struct {
	keys     []*fleetKey
	sent     int64
	deadline int64
	done     bool
}

type fleetMetrics struct {
	calls, failures, badAnswers, waits, degraded, refused, evictions counter
}

func (m *fleetMetrics) define() {
	m.calls.m, _ = proxywasm.DefineCounterMetric("sluice.quota.calls")
	m.failures.m, _ = proxywasm.DefineCounterMetric("sluice.quota.failures")
	m.badAnswers.m, _ = proxywasm.DefineCounterMetric("sluice.quota.bad_answers")
	m.waits.m, _ = proxywasm.DefineCounterMetric("sluice.quota.waits")
	m.degraded.m, _ = proxywasm.DefineCounterMetric("sluice.quota.degraded")
	m.refused.m, _ = proxywasm.DefineCounterMetric("sluice.quota.refused_keys")
	m.evictions.m, _ = proxywasm.DefineCounterMetric("sluice.quota.lease_evictions")
}

func (m *fleetMetrics) flush() {
	for _, c := range [...]*counter{&m.calls, &m.failures, &m.badAnswers, &m.waits, &m.degraded, &m.refused, &m.evictions} {
		c.flush()
	}
}

// fleetStart defines the fleet metrics and picks the Envoy id.
func (p *pluginContext) fleetStart() {
	p.fleet.m.define()
	p.fleet.keys = map[string]*fleetKey{}
	p.fleet.calls = map[*quotaCall]struct{}{}
	if cp := p.cfg.ControlPlane; cp.Envoy != "" {
		p.fleet.envoy = cp.Envoy
		return
	}
	if p.hashKeyOK {
		p.fleet.envoy = envoyID(p.hashKey)
	} // else set on the first quota call after the hash key is read
}

// envoyID is this Envoy's id for the quota service when the configuration
// names none: "<node id>~<16 hex digits>", or "sluice-<16 hex digits>" without
// a usable node id. The digits come from the per-Envoy hash key in shared data,
// so every worker of one Envoy has the same id and two Envoys never do, even
// when a static bootstrap gives every replica the same node.id: the quota
// service keeps one ledger of leases per id, and two Envoys sharing one would
// spend and return each other's units. The node id (Envoy >= 1.33 serves it
// as xds.node.id; older releases as node.id) keeps the id readable.
func envoyID(hashKey siphash.Key) string {
	suffix := strconv.FormatUint(siphash.Sum64(hashKey, []byte("envoy id")), 16)
	for _, path := range [][]string{{"xds", "node", "id"}, {"node", "id"}} {
		id, err := proxywasm.GetProperty(path)
		if err != nil || len(id) == 0 || !printableID(id) {
			continue
		}
		if max := quota.MaxEnvoyBytes - 1 - len(suffix); len(id) > max {
			id = id[:max]
		}
		return string(id) + "~" + suffix
	}
	return "sluice-" + suffix
}

func printableID(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// leaseKey is the shared-data key of lease bucket n of a fleet rule:
// "sluice/<policy>/<rule id>/<layout>/q/<n>".
func leaseKey(policy, rule, layout string, n int) string {
	return "sluice/" + policy + "/" + rule + "/" + layout + "/q/" + strconv.Itoa(n)
}

// initFleetRule sets rs's fleet part; for on_quota_failure "local" with a
// local_share, the rule's own counter buckets (unused while quota is
// leased) count the local share instead of the whole limit.
func (p *pluginContext) initFleetRule(c *rules.Compiled, rs *ruleState) {
	cr := rs.cr
	if !cr.Fleet() {
		return
	}
	switch cr.Rule.QuotaFailure() {
	case rules.QuotaFailurePass:
		rs.fleet.mode = fleetPass
	case rules.QuotaFailureDeny:
		rs.fleet.mode = fleetDeny
	default:
		rs.fleet.mode = fleetLocal
		if cfg := cr.Rule.LocalShareConfig(cr.Config); cfg != cr.Config {
			if lim, err := limit.New(cfg); err == nil {
				if layout, err := table.New(lim, p.cfg.EntriesPerBucket); err == nil {
					rs.layout = layout
				}
			}
		}
	}
	rs.fleet.leaseKeys = make([]string, p.cfg.BucketsPerRule)
	for n := range rs.fleet.leaseKeys {
		rs.fleet.leaseKeys[n] = leaseKey(c.Name, cr.ID, p.layout(), n)
	}
}

// createLeaseBuckets makes the lease buckets of c's fleet rules exist (see
// createBuckets for why and how).
func (p *pluginContext) createLeaseBuckets(c *rules.Compiled) error {
	fleetRules := 0
	for i := 0; i < c.Len(); i++ {
		if c.Rule(i).Fleet() {
			fleetRules++
		}
	}
	if fleetRules == 0 {
		return nil // no host call for a policy without fleet rules
	}
	witness := casAbsent
	if _, cas, err := proxywasm.GetSharedData(hashKeyKey); err == nil {
		witness = cas
	}
	for i := 0; i < c.Len(); i++ {
		if !c.Rule(i).Fleet() {
			continue
		}
		for n := 0; n < p.cfg.BucketsPerRule; n++ {
			key := leaseKey(c.Name, c.Rule(i).ID, p.layout(), n)
			_, cas, err := proxywasm.GetSharedData(key)
			switch {
			case err == nil:
				witness = cas
				continue
			case !errors.Is(err, proxywasm.ErrNotFound):
				return errors.New("reading " + key + ": " + err.Error())
			}
			if err := proxywasm.SetSharedData(key, nil, witness); err != nil && !errors.Is(err, proxywasm.ErrCasMismatch) {
				return errors.New("creating " + key + ": " + err.Error())
			}
		}
	}
	return nil
}

// readDecideFleet decides a fleet rule: from the lease when it holds the
// cost, else from what the worker knows of the key (refused, failed), else
// pending. False if shared data could not be read.
func (p *pluginContext) readDecideFleet(ev *eval, now int64) bool {
	rs := ev.rule
	ev.fl = fleetEval{read: true}
	value, cas, err := proxywasm.GetSharedData(rs.fleet.leaseKeys[ev.bucket])
	switch {
	case errors.Is(err, proxywasm.ErrNotFound):
		value, cas = nil, casAbsent
	case err != nil:
		proxywasm.LogDebug("sluice: reading " + rs.fleet.leaseKeys[ev.bucket] + ": " + err.Error())
		return false
	}
	ev.value, ev.cas = value, cas
	lim := rs.cr.Config.Limit
	e, _, found := fleet.Find(value, ev.hash)
	if found && e.Usable(rs.cr.Fingerprint, now, ev.cost) {
		e.Held -= ev.cost
		e.Used += ev.cost
		e.LastUse = now
		ev.fl.lease, ev.fl.entry = true, e
		ev.dec = limit.Decision{Allowed: true, Limit: lim, Remaining: e.Held, Reset: time.Duration(e.Expiry - now)}
		return true
	}
	kr := p.fleet.keys[viewString(p.s.key[ev.keyOff:ev.keyEnd])]
	switch {
	case !p.cfg.ControlPlane.Enabled || (kr != nil && kr.failedUntil > now):
		until := now + int64(p.cfg.ControlPlane.QuotaInterval)
		if kr != nil {
			until = kr.failedUntil
		}
		return p.degrade(ev, now, until)
	case kr != nil && kr.refusedUntil > now:
		ev.dec = limit.Decision{Allowed: false, Limit: lim, RetryAfter: max(kr.retryAfter, time.Duration(kr.refusedUntil-now)), Reset: kr.retryAfter}
	case p.fleet.round() >= maxQuotaRounds:
		// The request already waited its rounds (other requests took the
		// units granted meanwhile): deny, as a refusal would.
		ev.dec = limit.Decision{Allowed: false, Limit: lim, RetryAfter: time.Second, Reset: time.Second}
	default:
		ev.fl.pending = true
		p.fleet.pending++
		ev.dec = limit.Decision{Allowed: true, Limit: lim}
	}
	return true
}

// round is the quota rounds of the request being decided.
func (w *fleetWorker) round() int { return w.curRounds }

// degrade decides ev as its rule's on_quota_failure says.
func (p *pluginContext) degrade(ev *eval, now, until int64) bool {
	rs := ev.rule
	ev.fl.degraded = true
	switch rs.fleet.mode {
	case fleetPass:
		ev.fl.skip = true
		ev.dec = limit.Decision{Allowed: true, Limit: rs.cr.Config.Limit}
		return true
	case fleetDeny:
		ev.dec = limit.Decision{Allowed: false, Limit: rs.cr.Config.Limit, RetryAfter: max(time.Duration(until-now), time.Second), Reset: time.Duration(until - now)}
		return true
	}
	return p.readDecideLocal(ev, now)
}

// writeLease writes ev's lease entry by CAS.
func (p *pluginContext) writeLease(ev *eval, now int64) error {
	s := &p.s
	out, evicted := fleet.Put(s.bucket[:0], ev.value, ev.fl.entry, p.cfg.EntriesPerBucket, now)
	s.bucket = out[:0]
	if evicted {
		p.fleet.m.evictions.Increment(1)
	}
	return proxywasm.SetSharedData(ev.rule.fleet.leaseKeys[ev.bucket], out, ev.cas)
}

// modifyLease applies f to the entry of hash in a lease bucket by read → f
// → CAS write, retrying up to cas_retries times. f gets the entry (found
// reports whether it existed) and returns false to write nothing.
func (p *pluginContext) modifyLease(key string, hash uint64, now int64, f func(e *fleet.Entry, found bool) bool) bool {
	for attempt := 0; ; attempt++ {
		value, cas, err := proxywasm.GetSharedData(key)
		switch {
		case errors.Is(err, proxywasm.ErrNotFound):
			value, cas = nil, casAbsent
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
		out, _ := fleet.Put(p.s.modBucket[:0], value, e, p.cfg.EntriesPerBucket, now)
		p.s.modBucket = out[:0]
		err = proxywasm.SetSharedData(key, out, cas)
		if err == nil {
			return true
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			return false
		}
		p.m.casRetries.Increment(1)
		if attempt >= p.cfg.CASRetries {
			p.m.casExhausted.Increment(1)
			return false
		}
	}
}

// undoLease gives a denied request's units back to the lease.
func (p *pluginContext) undoLease(ev *eval, now int64) bool {
	fp := ev.rule.cr.Fingerprint
	return p.modifyLease(ev.rule.fleet.leaseKeys[ev.bucket], ev.hash, now, func(e *fleet.Entry, found bool) bool {
		if !found || e.Fingerprint != fp {
			return false
		}
		e.Held += ev.cost
		e.Used -= min(e.Used, ev.cost)
		return true
	})
}

// fleetWait runs after every rule was read: if an enforced fleet rule has
// no quota, the request waits (the worker asks for the keys not already
// asked for, in one call) and it returns true. A shadow rule without quota
// never makes a request wait: its key is asked for, and the rule counts
// nothing this time. If the call cannot be made, the pending rules degrade
// at once and it returns false.
func (h *httpContext) fleetWait(now int64) bool {
	p := h.p
	p.fleet.pending = 0
	s := &p.s
	wait := false
	for k := range s.evals {
		ev := &s.evals[k]
		if ev.fl.pending && !ev.rule.cr.Shadow {
			wait = true
		}
	}
	var batch []*fleetKey
	seq := uint64(0)
	if wait {
		p.fleet.seq++
		seq = p.fleet.seq
	}
	for k := range s.evals {
		ev := &s.evals[k]
		if !ev.fl.pending {
			continue
		}
		kr := p.fleetKeyFor(ev, now)
		if kr == nil || (wait && len(kr.waiters) >= maxKeyWaiters) {
			wait = false // no room: decide as on_quota_failure says
			batch = nil
			break
		}
		kr.want += ev.cost
		if wait && !ev.rule.cr.Shadow {
			kr.waiters = append(kr.waiters, fleetWaiter{h: h, seq: seq})
		}
		if kr.call == nil {
			batch = append(batch, kr)
		}
	}
	if len(batch) > 0 && !p.sendQuota(batch, now) {
		wait = false
	}
	if wait {
		h.fq.seq = seq
		h.fq.rounds++
		h.fq.waited = true
		p.fleet.m.waits.Increment(1)
		return true
	}
	// Not waiting: shadow rules count nothing; enforced ones degrade.
	for k := range s.evals {
		ev := &s.evals[k]
		if !ev.fl.pending {
			continue
		}
		ev.fl.pending = false
		if ev.rule.cr.Shadow {
			ev.fl.skip = true
			continue
		}
		until := now + int64(p.cfg.ControlPlane.QuotaInterval)
		p.degrade(ev, now, until)
	}
	return false
}

// fleetCommitWait handles a fleet rule whose lease ran dry between its
// read and its write (another worker spent it): what was written is undone
// and the request waits for quota. done is false when it cannot wait (the
// rule then degraded, and ev.dec says what to do).
func (h *httpContext) fleetCommitWait(ev *eval, now int64) (outcome, bool) {
	h.compensate(now)
	if h.fleetWait(now) {
		return outcome{wait: true}, true
	}
	if ev.dec.Allowed {
		// Degraded to pass or local: the earlier rules' charges were undone,
		// so decide the request afresh is not possible here; deny it as a
		// refusal would rather than admit it uncounted.
		ev.dec = limit.Decision{Allowed: false, Limit: ev.rule.cr.Config.Limit, RetryAfter: time.Second, Reset: time.Second}
	}
	return outcome{}, false
}

// fleetKeyFor returns the worker's record of ev's key, creating it (nil if
// the key is longer than quota.MaxKeyBytes, or if the worker already
// remembers maxFleetKeys keys and none can be dropped).
func (p *pluginContext) fleetKeyFor(ev *eval, now int64) *fleetKey {
	key := viewString(p.s.key[ev.keyOff:ev.keyEnd])
	if kr := p.fleet.keys[key]; kr != nil {
		kr.lastSeen = now
		return kr
	}
	if len(key) > quota.MaxKeyBytes {
		// The service would refuse the whole batch (HTTP 400) for it: such a
		// key (a client's oversized header) never travels, and degrades.
		return nil
	}
	if len(p.fleet.keys) >= maxFleetKeys {
		p.forgetIdleKeys(now, true)
		if len(p.fleet.keys) >= maxFleetKeys {
			return nil
		}
	}
	kr := &fleetKey{key: string(p.s.key[ev.keyOff:ev.keyEnd]), ruleID: ev.rule.cr.ID, hash: ev.hash, bucket: ev.bucket, lastSeen: now}
	p.fleet.keys[kr.key] = kr
	return kr
}

// forgetIdleKeys drops records of keys with no call, no waiters and no
// recent use (any such key when force).
func (p *pluginContext) forgetIdleKeys(now int64, force bool) {
	idle := now - 10*int64(p.cfg.ControlPlane.QuotaInterval)
	for k, kr := range p.fleet.keys {
		if kr.call == nil && len(kr.waiters) == 0 && (force || kr.lastSeen < idle) && kr.refusedUntil < now && kr.failedUntil < now {
			delete(p.fleet.keys, k)
		}
	}
}

// sendQuota asks for (and reports on) keys in one call; false if the call
// could not be dispatched (the keys are then marked failed).
func (p *pluginContext) sendQuota(keys []*fleetKey, now int64) bool {
	return p.sendReport(keys, nil, now)
}

// What a report does for a key.
const (
	askKey    uint8 = iota // report use and ask for units
	returnKey              // report use and return the held units
	reportKey              // report use only
)

// sendReport sends one quota request for keys: per key, the units spent since
// the last report (taken from the lease entry), the units to return (for
// returnKey: the key's held units, taken from the entry) and the units wanted
// (for askKey; kinds nil means askKey for all).
func (p *pluginContext) sendReport(keys []*fleetKey, kinds []uint8, now int64) bool {
	ps := p.pol
	cp := p.cfg.ControlPlane
	if ps == nil || len(keys) == 0 {
		return true
	}
	if len(keys) > quota.DefaultMaxKeys {
		keys = keys[:quota.DefaultMaxKeys]
	}
	timeout := int64(cp.QuotaTimeout)
	if p.fleet.envoy == "" && p.hashKeyOK {
		p.fleet.envoy = envoyID(p.hashKey)
	}
	req := quota.Request{Envoy: p.fleet.envoy, Policy: ps.compiled.Name, Version: ps.version,
		Env: ps.compiled.Env(), Interval: cp.QuotaInterval, Keys: make([]quota.KeyRequest, 0, len(keys))}
	// The host answers a call past its timeout (504); the deadline only guards
	// against an answer that never comes, checked on each tick.
	call := &quotaCall{sent: now, deadline: now + timeout + 2*int64(p.cfg.Tick)}
	for i, kr := range keys {
		rs := p.fleetRuleByID(kr.ruleID)
		if rs == nil {
			continue
		}
		kind := askKey
		if kinds != nil {
			kind = kinds[i]
		}
		var used, back uint64
		fp := rs.cr.Fingerprint
		p.modifyLease(rs.fleet.leaseKeys[kr.bucket], kr.hash, now, func(e *fleet.Entry, found bool) bool {
			if !found {
				used, back = 0, 0
				return false
			}
			used, back = e.Used, 0
			e.Used = 0
			switch kind {
			case returnKey:
				back = e.Live(fp, now)
				e.Held = 0
			case askKey:
				e.Claim = now + timeout
			}
			return true
		})
		want := uint64(0)
		if kind == askKey {
			want = max(kr.want, 2*used, minWant)
			if kr.granted {
				want = max(want, sizedWant)
			}
			want = min(want, quota.MaxUnits)
		}
		kr.want = 0
		req.Keys = append(req.Keys, quota.KeyRequest{Rule: kr.ruleID, Key: kr.key, Used: min(used, quota.MaxUnits), Return: min(back, quota.MaxUnits), Want: want})
		call.keys = append(call.keys, kr)
		if kind == askKey {
			kr.call = call
		}
	}
	if len(req.Keys) == 0 {
		return true
	}
	p.fleet.buf = quota.AppendRequest(p.fleet.buf[:0], &req)
	headers := [][2]string{
		{":method", "POST"}, {":path", quotaPath}, {":authority", cp.Authority},
		{"content-type", "application/json"},
	}
	if cp.QuotaToken != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + cp.QuotaToken})
	}
	p.fleet.m.calls.Increment(1)
	_, err := proxywasm.DispatchRootHttpCall(cp.Cluster, headers, p.fleet.buf, nil, uint32(cp.QuotaTimeout.Milliseconds()),
		func(numHeaders, bodySize, _ int) { p.onQuotaAnswer(call, numHeaders, bodySize) })
	if cap(p.fleet.buf) > maxKeepBytes {
		p.fleet.buf = nil
	}
	if err != nil {
		proxywasm.LogDebug("sluice: quota call: " + err.Error())
		p.fleet.m.failures.Increment(1)
		for _, kr := range call.keys {
			if kr.call == call {
				kr.call = nil
			}
			kr.failedUntil = now + int64(cp.QuotaInterval)
		}
		return false
	}
	p.fleet.calls[call] = struct{}{}
	return true
}

// fleetRuleByID returns the fleet rule of that id in the policy in use.
func (p *pluginContext) fleetRuleByID(id string) *ruleState {
	if p.pol == nil {
		return nil
	}
	for i := range p.pol.rules {
		rs := &p.pol.rules[i]
		if rs.cr.ID == id {
			if rs.fleet.mode == fleetNone {
				return nil
			}
			return rs
		}
	}
	return nil
}

// onQuotaAnswer applies a quota answer to the leases and resumes or answers
// the requests waiting on its keys.
func (p *pluginContext) onQuotaAnswer(call *quotaCall, numHeaders, bodySize int) {
	if call.done {
		return
	}
	now := time.Now().UnixNano()
	var resp *quota.Response
	if numHeaders > 0 {
		status, _ := proxywasm.GetHttpCallResponseHeader(":status")
		if status == "200" {
			if bodySize > maxQuotaAnswerBytes {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: quota answer of " + strconv.Itoa(bodySize) + " bytes is over the limit")
			} else if body, err := proxywasm.GetHttpCallResponseBody(0, bodySize); err != nil {
				proxywasm.LogDebug("sluice: reading the quota answer: " + err.Error())
			} else if r, err := quota.DecodeResponse(body); err != nil {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: malformed quota answer: " + err.Error())
			} else if !answerMatches(r, call) {
				p.fleet.m.badAnswers.Increment(1)
				proxywasm.LogDebug("sluice: quota answer does not match the request's keys")
			} else {
				resp = r
			}
		} else {
			proxywasm.LogDebug("sluice: quota service answered " + status)
		}
	}
	p.finishCall(call, resp, now)
}

func answerMatches(r *quota.Response, call *quotaCall) bool {
	if len(r.Keys) != len(call.keys) {
		return false
	}
	for i, kr := range call.keys {
		if r.Keys[i].Key != kr.key {
			return false
		}
	}
	return true
}

// finishCall applies an answer (nil: the call failed) and handles the waiters.
func (p *pluginContext) finishCall(call *quotaCall, resp *quota.Response, now int64) {
	call.done = true
	delete(p.fleet.calls, call)
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	if resp == nil {
		p.fleet.m.failures.Increment(1)
	}
	for i, kr := range call.keys {
		if kr.call != call {
			continue // a return-only entry
		}
		kr.call = nil
		if resp == nil {
			kr.failedUntil = now + interval
			continue
		}
		p.applyResult(kr, &resp.Keys[i], call.sent, now)
	}
	for _, kr := range call.keys {
		if kr.call == nil { // not while another call for the key is in flight
			p.resumeWaiters(kr)
		}
	}
}

// applyResult adds a key's grant to the lease, or records a refusal or a
// status that degrades the key.
func (p *pluginContext) applyResult(kr *fleetKey, r *quota.KeyResult, sent, now int64) {
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	rs := p.fleetRuleByID(kr.ruleID)
	if rs == nil {
		return
	}
	switch r.Status {
	case quota.StatusGranted, quota.StatusPartial:
		kr.failedUntil, kr.refusedUntil = 0, 0
		kr.granted = kr.granted || r.Granted > 0
		fp := rs.cr.Fingerprint
		expiry := sent + int64(r.ExpiresIn)
		p.modifyLease(rs.fleet.leaseKeys[kr.bucket], kr.hash, now, func(e *fleet.Entry, found bool) bool {
			e.Claim = 0
			if r.Granted == 0 || r.ExpiresIn <= 0 {
				return found
			}
			if !found || e.Fingerprint != fp || now >= e.Expiry {
				*e = fleet.Entry{Hash: kr.hash, Fingerprint: fp, Used: e.Used, LastUse: e.LastUse}
				e.Held, e.Expiry, e.Sent = r.Granted, expiry, sent
				return true
			}
			e.Held += r.Granted
			if sent >= e.Sent {
				e.Expiry, e.Sent = expiry, sent
			} else {
				e.Expiry = min(e.Expiry, expiry)
			}
			return true
		})
		if r.Status == quota.StatusPartial && r.Granted == 0 {
			kr.refusedUntil = now + min(int64(r.RetryAfter), interval)
		}
	case quota.StatusRefused:
		p.fleet.m.refused.Increment(1)
		ra := r.RetryAfter
		if ra <= 0 || ra == limit.Never {
			ra = time.Duration(interval)
		}
		kr.retryAfter = ra
		kr.refusedUntil = now + min(int64(ra), interval)
	default: // stale_policy, unknown_rule, not_fleet, bad_key
		proxywasm.LogDebug("sluice: quota service: key of rule " + kr.ruleID + ": " + r.Status)
		kr.failedUntil = now + interval
	}
}

// resumeWaiters re-decides every request waiting on kr, each with its
// stream as the effective context: it continues, is answered, or waits again.
// A request whose stream ended meanwhile is skipped.
func (p *pluginContext) resumeWaiters(kr *fleetKey) {
	waiters := kr.waiters
	kr.waiters = nil
	for _, w := range waiters {
		h := w.h
		if h.fq.seq != w.seq || w.seq == 0 {
			continue
		}
		if err := proxywasm.SetEffectiveContext(h.fq.id); err != nil {
			h.fq.seq = 0
			continue
		}
		h.fq.seq = 0
		if h.OnHttpRequestHeaders(0, false) == types.ActionContinue {
			if err := proxywasm.ResumeHttpRequest(); err != nil {
				proxywasm.LogDebug("sluice: resuming a request: " + err.Error())
			}
		}
	}
}

// fleetStreamDone forgets a stream that ended, so that an answer arriving
// later does not touch it.
func (h *httpContext) fleetStreamDone() { h.fq.seq = 0 }

// fleetTick reports use, tops up leases running low and returns the units
// of idle keys, once per quota_interval, in one call; it also ends calls
// whose answer never came (the waiters degrade).
func (p *pluginContext) fleetTick() {
	p.fleet.m.flush()
	now := time.Now().UnixNano()
	if orphans := p.fleet.orphans; len(orphans) > 0 {
		p.fleet.orphans = nil
		for _, kr := range orphans {
			p.resumeWaiters(kr)
		}
	}
	for call := range p.fleet.calls {
		if now > call.deadline {
			p.finishCall(call, nil, now)
		}
	}
	if p.pol == nil || !p.cfg.ControlPlane.Enabled || now < p.fleet.nextReport {
		return
	}
	interval := int64(p.cfg.ControlPlane.QuotaInterval)
	p.fleet.nextReport = now + interval
	var keys []*fleetKey
	var kinds []uint8
	for _, kr := range p.fleet.keys {
		if kr.call != nil {
			continue
		}
		rs := p.fleetRuleByID(kr.ruleID)
		if rs == nil {
			delete(p.fleet.keys, kr.key)
			continue
		}
		value, _, err := proxywasm.GetSharedData(rs.fleet.leaseKeys[kr.bucket])
		if err != nil {
			continue
		}
		e, _, found := fleet.Find(value, kr.hash)
		if !found {
			continue
		}
		live := e.Live(rs.cr.Fingerprint, now)
		switch {
		case live > 0 && now-e.LastUse > 3*interval:
			// Idle: give the units back; its next ask starts small again
			// (the service may have forgotten its use by then).
			kr.granted = false
			keys, kinds = append(keys, kr), append(kinds, returnKey)
		case now-e.LastUse <= 2*interval && e.Claim <= now && kr.refusedUntil <= now &&
			(live <= 2*e.Used || e.Expiry-now <= 2*interval):
			kr.want = max(kr.want, 2*e.Used)
			keys, kinds = append(keys, kr), append(kinds, askKey)
		case e.Used > 0:
			keys, kinds = append(keys, kr), append(kinds, reportKey)
		}
		if len(keys) >= quota.DefaultMaxKeys {
			break
		}
	}
	if len(keys) > 0 {
		p.sendReport(keys, kinds, now)
	}
	p.forgetIdleKeys(now, false)
}

// fleetPolicyChanged drops the worker's records of keys whose rule the new
// policy removed, made envoy-scoped or changed (their leases are void: an
// entry of another fingerprint reads as absent), resuming their waiters
// under the new policy on the next tick. Their units are not returned: the quota service
// answers a report under the old version stale_policy, and under the new one
// the rule's key is another lease; the service gets them back when the
// lease ends.
func (p *pluginContext) fleetPolicyChanged(old *policyState) {
	if old == nil || len(p.fleet.keys) == 0 {
		return
	}
	var dropped []*fleetKey
	for _, kr := range p.fleet.keys {
		var before *ruleState
		for i := range old.rules {
			if old.rules[i].cr.ID == kr.ruleID {
				before = &old.rules[i]
			}
		}
		after := p.fleetRuleByID(kr.ruleID)
		if after != nil && before != nil && before.cr.Fingerprint == after.cr.Fingerprint {
			continue
		}
		delete(p.fleet.keys, kr.key)
		kr.call = nil
		dropped = append(dropped, kr)
	}
	// Not here: a policy can be applied from a request's own callback (rule
	// sync checks for one first), and re-deciding other streams would leave
	// the effective context on them. The tick re-decides them.
	p.fleet.orphans = append(p.fleet.orphans, dropped...)
}

// fleetDone returns every unused unit this worker's keys hold, as the
// plugin goes away (Envoy may not deliver the answer; nothing waits on it).
func (p *pluginContext) fleetDone() {
	if p.pol == nil || !p.cfg.ControlPlane.Enabled || len(p.fleet.keys) == 0 {
		return
	}
	now := time.Now().UnixNano()
	var keys []*fleetKey
	var kinds []uint8
	for _, kr := range p.fleet.keys {
		keys, kinds = append(keys, kr), append(kinds, returnKey)
	}
	p.sendReport(keys, kinds, now)
	p.fleet.m.flush()
}

// setFleetState writes sluice.scope and sluice.quota when the reported rule
// is fleet-scoped (nothing for envoy-scoped rules: the access log shows "-").
func (h *httpContext) setFleetState() {
	if !h.hasReport || h.report.rule.fleet.mode == fleetNone {
		return
	}
	p := h.p
	degraded := false
	for k := range p.s.evals {
		if p.s.evals[k].fl.degraded {
			degraded = true
		}
	}
	setProp(propScope, valFleet)
	switch {
	case degraded:
		p.fleet.m.degraded.Increment(1)
		setProp(propQuota, valDegrade)
		setProp(propReason, bytesOf(reasonQuotaUnavailable))
	case h.fq.waited:
		setProp(propQuota, valWaited)
	default:
		setProp(propQuota, valLocal)
	}
}
