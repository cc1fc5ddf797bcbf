package policysync

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// Metric names (proxy-wasm metrics; Envoy shows them as wasmcustom.<name>
// in /stats and as <name> in /stats/prometheus).
const (
	// MetricVersion is a gauge: the policy version last applied (the
	// plugin records its gauge of the policy in use under the same name).
	MetricVersion = "sluice.policy_version"
	// MetricSyncSuccesses counts polls that ended in sync: a 304, or a 200
	// whose policy was valid.
	MetricSyncSuccesses = "sluice.policy_sync.successes"
	// MetricSyncFailuresPrefix + a FailureKind counts failed polls by kind,
	// e.g. sluice.policy_sync.failures.reset.
	MetricSyncFailuresPrefix = "sluice.policy_sync.failures."
	// MetricLastSync is a gauge: the Unix time in seconds of the last
	// successful poll.
	MetricLastSync = "sluice.policy_sync.last_success_seconds"
)

// FailureKind classifies a failed poll, for metrics and logs.
type FailureKind string

// The failure kinds.
const (
	// FailHTTPStatus: the control plane (or Envoy for it, e.g. 503 "no
	// healthy upstream") answered with a status other than 200 and 304.
	FailHTTPStatus FailureKind = "http_status"
	// FailReset: the call failed without a response (zero headers; Envoy's
	// proxy_get_status says "reset"), e.g. the body was cut short.
	FailReset FailureKind = "reset"
	// FailInvalidPolicy: a 200 whose body is not a valid policy named
	// Options.Policy (rules.ParsePolicy or rules.Compile failed).
	FailInvalidPolicy FailureKind = "invalid_policy"
	// FailTooLarge: a 200 whose body exceeds rules.MaxPolicyBytes.
	FailTooLarge FailureKind = "too_large"
	// FailDispatch: proxy_http_call refused the call (unknown cluster,
	// no healthy host).
	FailDispatch FailureKind = "dispatch"
)

// FailureKinds lists every FailureKind.
var FailureKinds = []FailureKind{FailHTTPStatus, FailReset, FailInvalidPolicy, FailTooLarge, FailDispatch}

// maxLogReason bounds the part of a log line that comes from the network
// or from a validation report, in bytes.
const maxLogReason = 512

// envoyTimeoutBody is the body of the 504 Envoy's router answers when a
// callout's timeout fires (Envoy source/common/router/router.cc,
// the upstream-timeout local reply).
const envoyTimeoutBody = "upstream request timeout"

// Syncer keeps one plugin instance's policy in step with the control plane
// (see the package documentation). A Syncer belongs to one root context and
// is driven by its callbacks: Start from OnPluginStart, Tick from OnTick,
// Check from the request path, Stop from OnPluginDone. It is not safe for
// concurrent use, and need not be: a VM runs one callback at a time.
type Syncer struct {
	o   Options
	h   Host
	me  uint64
	log logger

	leaseKey, metaKey string

	// Follower state.
	appliedGen     uint64 // generation applied (0: none yet)
	appliedVersion uint64
	badGen         uint64 // generation whose document failed to compile here
	lastCheck      int64  // Unix ns of the last meta read

	// Lease holder state.
	holding     bool
	inFlight    bool
	callSeq     uint64 // identifies the call in flight
	callStart   int64  // Unix ns
	nextPoll    int64  // Unix ns; a poll may start at or after it
	etag        string // If-None-Match of the next poll
	backoff     Backoff
	failing     bool // for logging once per state change
	lastFailure FailureKind
}

// New returns a Syncer for o. It makes no hostcall.
//
// # Errors
//
// An error naming the field if o.Policy is not a valid policy name, Apply
// is nil, Timeout does not exceed Wait, Timeout exceeds 2^31-1 ms, a
// duration is below 1 ms, or Lease is shorter than two ticks.
func New(o Options) (*Syncer, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	me := o.VMToken
	for me == 0 {
		me = rand.Uint64()
	}
	s := &Syncer{
		o: o, h: o.Host, me: me,
		log:      logger{h: o.Host, prefix: "policysync: " + o.Policy + ": "},
		leaseKey: LeaseKey(o.Policy),
		metaKey:  MetaKey(o.Policy),
		backoff:  Backoff{Min: DefaultBackoffMin, Max: DefaultBackoffMax, Int64N: o.Int64N},
	}
	return s, nil
}

// Start runs at plugin start (proxy_on_configure, also in Envoy's canary):
// it creates the lease and meta keys if absent, so that afterwards they are
// only ever written by compare-and-swap, and applies the policy already
// published, if any, so a restarted worker enforces it at once.
func (s *Syncer) Start() {
	if s.o.Cluster != "" {
		s.createKeys()
	}
	s.refresh(s.nowNanos())
}

// createKeys creates the lease key (free) and the meta key (empty) if they
// are absent. Envoy creates an absent key whatever the cas of the write,
// so a creating write carries the cas of another existing key (a witness):
// no write to this key can ever have had that cas, since every write takes
// the next value of one global counter, so if another VM created the key
// in between, this write fails with CAS_MISMATCH instead of overwriting
// it. Only the very first key, with no witness yet, is written with
// casAbsent (residual: it overwrites a key created in between whose cas is
// exactly 0xFFFFFFFF).
func (s *Syncer) createKeys() {
	_, leaseCas, leaseErr := s.h.GetSharedData(s.leaseKey)
	_, metaCas, metaErr := s.h.GetSharedData(s.metaKey)
	absent := func(err error) bool { return errors.Is(err, proxywasm.ErrNotFound) }
	if absent(leaseErr) {
		witness := casAbsent
		if metaErr == nil {
			witness = metaCas
		}
		_ = s.h.SetSharedData(s.leaseKey, AppendLease(nil, Lease{}), witness)
		_, leaseCas, leaseErr = s.h.GetSharedData(s.leaseKey)
	}
	if absent(metaErr) && leaseErr == nil {
		_ = s.h.SetSharedData(s.metaKey, nil, leaseCas)
	}
}

// casAbsent is the cas of a creating write that has no witness (see
// createKeys): a non-zero cas, so that the write fails rather than
// overwrites if the key was created meanwhile, except in the residual case.
const casAbsent = ^uint32(0)

// Tick runs on every tick: it applies a newly published policy, takes or
// renews the lease, and, as lease holder, starts a poll when none is in
// flight and no backoff is pending.
func (s *Syncer) Tick() {
	now := s.nowNanos()
	s.refresh(now)
	if s.o.Cluster == "" {
		return
	}
	s.renewLease(now)
	if s.holding {
		s.maybePoll(now)
	}
}

// Check runs on the request path: at most every RequestCheckInterval it
// reads the published meta and applies a new policy, so that under traffic
// a change is enforced before the next tick.
func (s *Syncer) Check() {
	now := s.nowNanos()
	if now-s.lastCheck < int64(RequestCheckInterval) && now >= s.lastCheck {
		return
	}
	s.refresh(now)
}

// Stop runs at plugin shutdown: a holder releases the lease so another
// worker takes it on its next tick instead of after the expiry.
func (s *Syncer) Stop() {
	if !s.holding {
		return
	}
	s.holding = false
	val, cas, err := s.h.GetSharedData(s.leaseKey)
	if err != nil {
		return
	}
	if cur, _ := DecodeLease(val); cur.Holder == s.me {
		_ = s.h.SetSharedData(s.leaseKey, AppendLease(nil, Lease{}), cas)
	}
}

// Version returns the version of the policy applied last and whether one
// has been applied at all.
func (s *Syncer) Version() (version uint64, ok bool) { return s.appliedVersion, s.appliedGen != 0 }

// Holding reports whether this instance held the sync lease at its last
// tick.
func (s *Syncer) Holding() bool { return s.holding }

// VMToken returns this instance's lease token.
func (s *Syncer) VMToken() uint64 { return s.me }

func (s *Syncer) nowNanos() int64 { return s.o.Now().UnixNano() }

// --- follower ---

// refresh reads the published meta and, if it names a generation not yet
// applied, reads, verifies, parses, compiles and applies its document. A
// torn read is left for the next check; a document that does not compile
// here is logged once and skipped until the next publication.
func (s *Syncer) refresh(now int64) {
	s.lastCheck = now
	val, _, err := s.h.GetSharedData(s.metaKey)
	if err != nil {
		return
	}
	m, ok := DecodeMeta(val)
	if !ok || !m.Published() || m.Generation == s.appliedGen || m.Generation == s.badGen {
		return
	}
	doc, ok := s.readChunks(m)
	if !ok {
		return // torn: a newer publication retired these chunks meanwhile
	}
	c, err := s.compile(doc)
	if err == nil {
		err = s.install(c, m.Generation)
	}
	if err != nil {
		s.badGen = m.Generation
		s.log.warn("published version " + u64(m.Version) + " (generation " + u64(m.Generation) +
			") rejected, keeping version " + u64(s.appliedVersion) + ": " + clip(err.Error()))
	}
}

func (s *Syncer) readChunks(m Meta) ([]byte, bool) {
	a := NewAssembler(m)
	for i := range int(m.Chunks) {
		v, _, err := s.h.GetSharedData(ChunkKey(s.o.Policy, m.Generation, i))
		if err != nil || !a.Add(i, v) {
			return nil, false
		}
	}
	return a.Document()
}

// compile parses and compiles a policy document and checks it is the
// policy this Syncer pulls.
func (s *Syncer) compile(doc []byte) (*rules.Compiled, error) {
	p, err := rules.ParsePolicy(doc)
	if err != nil {
		return nil, err
	}
	if p.Name != s.o.Policy {
		return nil, errors.New("policy is named " + strconv.Quote(clip(p.Name)) + ", want " + strconv.Quote(s.o.Policy))
	}
	c, err := rules.Compile(p, s.o.Compile)
	if err != nil {
		return nil, err
	}
	if s.o.Check != nil {
		if err := s.o.Check(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// install hands c to Apply and records it as generation gen.
func (s *Syncer) install(c *rules.Compiled, gen uint64) error {
	if err := s.o.Apply(c); err != nil {
		return err
	}
	s.appliedGen, s.appliedVersion = gen, c.Version
	s.h.Gauge(MetricVersion, c.Version)
	s.log.debug("applied policy version " + u64(c.Version) + " (generation " + u64(gen) + ")")
	return nil
}

// --- lease ---

// renewLease takes the lease if it is free or expired, or renews it if
// this instance holds it, by compare-and-swap on the lease key.
func (s *Syncer) renewLease(now int64) {
	val, cas, err := s.h.GetSharedData(s.leaseKey)
	if errors.Is(err, proxywasm.ErrNotFound) {
		// No canary created it (Start): create it free, then CAS as usual.
		s.createKeys()
		val, cas, err = s.h.GetSharedData(s.leaseKey)
	}
	if err != nil {
		s.setHolding(false, now)
		return
	}
	cur, _ := DecodeLease(val)
	next, take := NextLease(cur, s.me, now, s.o.Lease)
	if !take {
		s.setHolding(false, now)
		return
	}
	if err := s.h.SetSharedData(s.leaseKey, AppendLease(nil, next), cas); err != nil {
		s.setHolding(false, now) // another worker won the race
		return
	}
	s.setHolding(true, now)
}

// NextLease decides the lease step of instance me at now (Unix ns): if cur
// is free (Holder 0), expired (ExpiryNanos ≤ now) or already me's, it
// returns me's lease until now + ttl and take true, to be written by
// compare-and-swap; otherwise take is false and another holder keeps it.
func NextLease(cur Lease, me uint64, now int64, ttl time.Duration) (next Lease, take bool) {
	if cur.Holder != me && cur.Holder != 0 && cur.ExpiryNanos > now {
		return cur, false
	}
	return Lease{Holder: me, ExpiryNanos: now + int64(ttl)}, true
}

func (s *Syncer) setHolding(h bool, now int64) {
	if h == s.holding {
		return
	}
	s.holding = h
	if !h {
		s.log.info("lost the sync lease")
		return
	}
	// A new holder polls at once, from the published version's ETag.
	s.etag = ""
	if val, _, err := s.h.GetSharedData(s.metaKey); err == nil {
		if m, ok := DecodeMeta(val); ok {
			s.etag = m.ETag
		}
	}
	s.nextPoll = now
	s.log.info("took the sync lease (lease " + s.o.Lease.String() + ", wait " + s.o.Wait.String() + ")")
}

// --- poll ---

func (s *Syncer) maybePoll(now int64) {
	if s.inFlight || now < s.nextPoll {
		return
	}
	s.poll(now)
}

func (s *Syncer) poll(now int64) {
	headers := [][2]string{
		{":method", "GET"},
		{":path", "/v1/policies/" + s.o.Policy + "?wait=" + s.o.Wait.String()},
		{":authority", s.o.Authority},
		{"accept", "application/json"},
	}
	if s.o.Token != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + s.o.Token})
	}
	if s.etag != "" {
		headers = append(headers, [2]string{"if-none-match", s.etag})
	}
	s.callSeq++
	seq := s.callSeq
	_, err := s.h.DispatchHttpCall(s.o.Cluster, headers, nil, nil, uint32(s.o.Timeout.Milliseconds()),
		func(numHeaders, bodySize, _ int) { s.onResponse(seq, numHeaders, bodySize) })
	if err != nil {
		s.fail(now, FailDispatch, "proxy_http_call to cluster "+strconv.Quote(s.o.Cluster)+": "+err.Error())
		return
	}
	s.inFlight, s.callStart = true, now
}

// onResponse handles the poll's response, in proxy_on_http_call_response.
func (s *Syncer) onResponse(seq uint64, numHeaders, bodySize int) {
	if seq != s.callSeq || !s.inFlight {
		return
	}
	s.inFlight = false
	now := s.nowNanos()
	// Drop the result unless this instance still holds the lease (renewing
	// it if it lapsed unclaimed), so that two holders never publish.
	s.renewLease(now)
	if !s.holding {
		s.log.debug("dropped a poll result: lease lost while it was in flight")
		return
	}
	if numHeaders == 0 {
		s.fail(now, FailReset, "the call failed without a response (reset)")
		return
	}
	status, _ := s.h.GetHttpCallResponseHeader(":status")
	switch status {
	case "304":
		s.succeed(now)
		s.pollAgain(now, false)
	case "200":
		s.on200(now, bodySize)
	case "504":
		body, _ := s.h.GetHttpCallResponseBody(0, len(envoyTimeoutBody))
		if string(body) == envoyTimeoutBody || now-s.callStart >= int64(s.o.Timeout) {
			// The call's timeout: the long poll simply ended.
			s.pollAgain(now, false)
			return
		}
		s.fail(now, FailHTTPStatus, "status 504")
	default:
		s.fail(now, FailHTTPStatus, "status "+clip(status))
	}
}

func (s *Syncer) on200(now int64, bodySize int) {
	etag, _ := s.h.GetHttpCallResponseHeader("etag")
	if bodySize > rules.MaxPolicyBytes {
		s.etag = etag // wait for the next change rather than refetch
		s.fail(now, FailTooLarge, "policy of "+strconv.Itoa(bodySize)+" bytes exceeds "+strconv.Itoa(rules.MaxPolicyBytes))
		return
	}
	body, err := s.h.GetHttpCallResponseBody(0, bodySize)
	if err != nil && bodySize > 0 {
		s.fail(now, FailReset, "reading the response body: "+err.Error())
		return
	}
	if len(body) != bodySize {
		s.fail(now, FailInvalidPolicy, "body of "+strconv.Itoa(len(body))+" bytes, announced "+strconv.Itoa(bodySize))
		return
	}
	c, err := s.compile(body)
	if err != nil {
		s.etag = etag
		s.fail(now, FailInvalidPolicy, "invalid policy (etag "+clip(etag)+"), keeping version "+u64(s.appliedVersion)+": "+err.Error())
		return
	}
	if s.o.Prepare != nil {
		if err := s.o.Prepare(c); err != nil {
			s.fail(now, FailReset, "preparing version "+u64(c.Version)+": "+err.Error())
			return
		}
	}
	// Compiling and preparing take time; the lease may have lapsed
	// meanwhile and passed to another worker. Take it again (by
	// compare-and-swap) before publishing, or leave the publishing to the
	// new holder. Publication is safe without this (see publish); it saves
	// the work and keeps one publisher the rule.
	if s.renewLease(s.nowNanos()); !s.holding {
		s.log.debug("dropped a poll result: lease lost while preparing version " + u64(c.Version))
		return
	}
	prevETag := s.etag
	s.etag = etag
	published, gen, ok := s.publish(body, c.Version, etag)
	switch {
	case ok:
		defer s.pollAgain(now, true)
		s.log.info("published policy version " + u64(c.Version) + " (" + strconv.Itoa(len(body)) + " bytes, generation " + u64(gen) + ")")
		if err := s.install(c, gen); err != nil {
			s.badGen = gen
			s.log.warn("published version " + u64(c.Version) + " not applied here: " + clip(err.Error()))
		}
	case published >= c.Version:
		if published > c.Version {
			s.log.warn("control plane served version " + u64(c.Version) + " of the same epoch, below the published " + u64(published) +
				" (a control-plane replica behind?); keeping " + u64(published))
		}
		defer s.pollAgain(now, false)
	default:
		// Not published: fetch it again after the backoff, rather than
		// have the control plane answer 304 to its ETag.
		s.etag = prevETag
		s.fail(now, FailReset, "could not publish version "+u64(c.Version)+": shared data changed meanwhile")
		return
	}
	s.succeed(now)
}

// publish publishes doc (of version, with etag) unless the published policy
// is not superseded by it (see Supersedes; published then returns the
// published version). It is safe against any number of concurrent
// publishers, whatever the interleaving:
//
//  1. Claim: read the meta and, unless what it holds is not superseded by
//     (version, etag), write it back with Claimed+1 by compare-and-swap. The
//     winner owns generation gen = Claimed+1 alone: no other publisher can
//     claim it, so no other publisher ever writes its chunk keys.
//  2. Write the chunks under generation gen's own keys (ChunkKey). Nothing
//     any reader follows points at them yet.
//  3. Commit: read the meta again and, unless what it now holds is not
//     superseded, write {version, gen, ...} by compare-and-swap on the cas
//     just read. This single write is the commit point: the check and the
//     write see the same meta, so a publication never replaces a policy
//     that supersedes it, and the chunks it points to were complete before
//     it and are never written again by anyone but the publisher that
//     retires them.
//
// After a commit, the chunks of the generation it replaced are shrunk to
// empty (their keys stay; Envoy cannot delete); a publication that lost
// shrinks its own. A lost compare-and-swap is retried up to
// publishAttempts times per step; on failure published is 0.
func (s *Syncer) publish(doc []byte, version uint64, etag string) (published, gen uint64, ok bool) {
	// 1. Claim a generation.
	for attempt := 0; ; attempt++ {
		cur, cas, ok := s.readMeta()
		if !ok || attempt == publishAttempts {
			return 0, 0, false
		}
		if cur.Published() && !Supersedes(version, etag, cur.Version, cur.ETag) {
			return cur.Version, 0, false
		}
		claim := cur
		claim.Claimed = cur.Claimed + 1
		err := s.h.SetSharedData(s.metaKey, AppendMeta(nil, claim), cas)
		if err == nil {
			gen = claim.Claimed
			break
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			return 0, 0, false
		}
	}
	// 2. Write its chunks: keys nobody else writes.
	chunks := Chunks(doc, gen)
	for i, c := range chunks {
		if err := s.h.SetSharedData(ChunkKey(s.o.Policy, gen, i), c, 0); err != nil {
			s.retireChunks(gen, i)
			return 0, 0, false
		}
	}
	// 3. Commit by one compare-and-swap on the meta.
	m := Meta{
		Version: version, Generation: gen,
		Length: uint32(len(doc)), Chunks: uint32(len(chunks)),
		Checksum: Checksum(doc), ETag: etag,
	}
	for attempt := 0; attempt < publishAttempts; attempt++ {
		cur, cas, ok := s.readMeta()
		if !ok {
			break
		}
		if cur.Published() && !Supersedes(version, etag, cur.Version, cur.ETag) {
			s.retireChunks(gen, len(chunks))
			return cur.Version, 0, false
		}
		m.Claimed = max(cur.Claimed, gen)
		err := s.h.SetSharedData(s.metaKey, AppendMeta(nil, m), cas)
		if err == nil {
			if cur.Published() {
				s.retireChunks(cur.Generation, int(cur.Chunks))
			}
			return version, gen, true
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			break
		}
	}
	s.retireChunks(gen, len(chunks))
	return 0, 0, false
}

// publishAttempts bounds the compare-and-swap attempts of each step of
// publish: publishers contend only while a lease passes, so two suffice
// in practice.
const publishAttempts = 4

// readMeta reads the meta and its cas, creating the key if it is absent.
// A value that does not decode reads as the zero Meta (so it is
// overwritten by the next claim, still by compare-and-swap); ok is false
// only if shared data failed.
func (s *Syncer) readMeta() (m Meta, cas uint32, ok bool) {
	val, cas, err := s.h.GetSharedData(s.metaKey)
	if errors.Is(err, proxywasm.ErrNotFound) {
		s.createKeys()
		val, cas, err = s.h.GetSharedData(s.metaKey)
	}
	if err != nil {
		return Meta{}, 0, false
	}
	m, _ = DecodeMeta(val)
	return m, cas, true
}

// retireChunks shrinks the first n chunk keys of generation gen to empty
// values, which readers take for a torn read: a reader that was reading
// them reads the newer meta on its next check. Errors are ignored: a chunk
// left as it was only costs its bytes.
func (s *Syncer) retireChunks(gen uint64, n int) {
	for i := range min(n, MaxChunks) {
		key := ChunkKey(s.o.Policy, gen, i)
		if val, _, err := s.h.GetSharedData(key); err == nil && len(val) > 0 {
			_ = s.h.SetSharedData(key, nil, 0)
		}
	}
}

func (s *Syncer) succeed(now int64) {
	s.h.Counter(MetricSyncSuccesses, 1)
	s.h.Gauge(MetricLastSync, uint64(max(now, 0)/int64(time.Second)))
	if s.failing {
		s.log.info("sync recovered after " + strconv.Itoa(s.backoff.Failures()) + " failed polls (last: " + string(s.lastFailure) + ")")
		s.failing = false
	}
	s.backoff.Reset()
}

// pollAgain starts the next poll right away if the lease is still held.
// An answer that brought no change (304, timeout, a version already
// published) less than MinPollSpacing after its poll started defers the
// next poll until then, to the tick: a control plane or proxy that ignores
// ?wait costs at most one request per MinPollSpacing, not a busy loop.
func (s *Syncer) pollAgain(now int64, changed bool) {
	s.nextPoll = now
	if !changed && now-s.callStart < int64(MinPollSpacing) && now >= s.callStart {
		s.nextPoll = s.callStart + int64(MinPollSpacing)
		return
	}
	if s.holding {
		s.poll(now)
	}
}

func (s *Syncer) fail(now int64, kind FailureKind, reason string) {
	s.h.Counter(MetricSyncFailuresPrefix+string(kind), 1)
	wait := s.backoff.Next()
	s.nextPoll = now + int64(wait)
	s.lastFailure = kind
	switch {
	case kind == FailInvalidPolicy || kind == FailTooLarge:
		// Each rejected document is its own event (the ETag keeps the next
		// poll from refetching it), so it is always logged.
		s.log.warn("rejected: " + clip(reason))
	case !s.failing:
		s.log.warn("sync failing (" + string(kind) + "): " + clip(reason) + "; retrying with backoff")
	}
	s.failing = true
}

// Supersedes reports whether the control plane's document (version, etag)
// replaces the published one (pubVersion, pubETag). Within one store epoch
// (ETagEpoch; controlplane/openapi.yaml, "Versions and entity tags") only a
// higher version does, so a control-plane replica that is behind cannot
// move the policy back; a document of the same version with another tag
// (another content) does too, since within an epoch that happens only after
// the store lost a write. A document of another epoch always does, whatever
// its version: the store lost acknowledged writes and counts again, and its
// lower versions are the newer ones.
func Supersedes(version uint64, etag string, pubVersion uint64, pubETag string) bool {
	switch {
	case ETagEpoch(etag) != ETagEpoch(pubETag):
		return true
	case version != pubVersion:
		return version > pubVersion
	default:
		return etag != pubETag && ETagEpoch(etag) != ""
	}
}

// ETagEpoch returns the store epoch of a control-plane entity tag
// "v<version>.<epoch>.<sum>" (optionally weak, W/), or "" for a tag of
// another shape, such as the "v7" of control planes that predate epochs.
func ETagEpoch(etag string) string {
	etag = strings.TrimPrefix(etag, "W/")
	if len(etag) < 2 || etag[0] != '"' || etag[len(etag)-1] != '"' || etag[1] != 'v' {
		return ""
	}
	_, rest, ok := strings.Cut(etag[2:len(etag)-1], ".")
	if !ok {
		return ""
	}
	epoch, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	return epoch
}

// --- helpers ---

type logger struct {
	h      Host
	prefix string
}

func (l logger) debug(msg string) { l.h.Log(proxywasm.LogLevelDebug, l.prefix+msg) }
func (l logger) info(msg string)  { l.h.Log(proxywasm.LogLevelInfo, l.prefix+msg) }
func (l logger) warn(msg string)  { l.h.Log(proxywasm.LogLevelWarn, l.prefix+msg) }

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// clip bounds text that came from the network or a validation report.
func clip(s string) string {
	if len(s) <= maxLogReason {
		return s
	}
	return s[:maxLogReason] + "…"
}
