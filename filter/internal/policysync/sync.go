package policysync

import (
	"errors"
	"math/rand/v2"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
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
	node        string // the Envoy's node id, for x-sluice-node
	nodeRead    bool   // node was looked up
	failing     bool   // for logging once per state change
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
	// Every counter exists from the start, at 0: a failure rate reads 0, not
	// no series, until the first failure.
	s.h.Counter(MetricSyncSuccesses, 0)
	for _, k := range FailureKinds {
		s.h.Counter(MetricSyncFailuresPrefix+string(k), 0)
	}
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
// a change is enforced before the next tick. now is the request's clock
// reading (Unix ns, the clock Options.Now reads): the request path reads
// the clock once, and the check must not read it again (time.Now costs two
// WASI clock calls under wasip1).
func (s *Syncer) Check(now int64) {
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

type logger struct {
	h      Host
	prefix string
}

func (l logger) debug(msg string) { l.h.Log(proxywasm.LogLevelDebug, l.prefix+msg) }
func (l logger) info(msg string)  { l.h.Log(proxywasm.LogLevelInfo, l.prefix+msg) }
func (l logger) warn(msg string)  { l.h.Log(proxywasm.LogLevelWarn, l.prefix+msg) }

// clip bounds text that came from the network or a validation report.
func clip(s string) string {
	if len(s) <= maxLogReason {
		return s
	}
	return s[:maxLogReason] + "…"
}
