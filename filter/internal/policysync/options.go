package policysync

import (
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// Defaults for the Options fields left zero.
const (
	// DefaultWait is the long-poll wait sent as ?wait=: 30 s, so an idle
	// Envoy costs the control plane two requests a minute.
	DefaultWait = 30 * time.Second
	// DefaultTick is the plugin's tick period: 100 ms. A worker notices a
	// published policy within one tick, so propagation is the long poll's
	// wake-up plus at most one tick.
	DefaultTick = 100 * time.Millisecond
	// MinLease is the shortest default lease: a holder renews on every
	// tick, so the lease survives DefaultLeaseTicks - 1 missed ticks.
	MinLease = time.Second
	// DefaultLeaseTicks is the default lease in ticks: the lease is
	// max(MinLease, DefaultLeaseTicks × Tick).
	DefaultLeaseTicks = 10
	// RequestCheckInterval is how often, at most, a worker looks at the
	// published meta on the request path (one small shared-data read) in
	// addition to its tick; it makes propagation independent of the tick
	// period under traffic.
	RequestCheckInterval = 10 * time.Millisecond
	// MinPollSpacing is the least time between the starts of two polls
	// when the first brought no change (see the package documentation).
	MinPollSpacing = time.Second
)

// Options configure a Syncer. The plugin fills them from its
// configuration's "control_plane" section and "tick".
type Options struct {
	// Policy is the name of the policy to pull (rules.ValidName). Required.
	Policy string
	// Cluster is the Envoy cluster of the control plane, the first argument
	// of proxy_http_call. Empty means this plugin only follows: it applies
	// what another plugin instance publishes under Policy but never takes
	// the lease or polls.
	Cluster string
	// Authority is the poll's :authority; empty means Cluster.
	Authority string
	// Token is the control plane's read token, sent as
	// "authorization: Bearer <Token>"; empty sends no authorization.
	Token string
	// Wait is the long-poll wait (?wait=); 0 means DefaultWait.
	Wait time.Duration
	// Timeout is the callout timeout; 0 means Wait + max(1 s, Wait/10).
	// It must exceed Wait, or every poll would time out.
	Timeout time.Duration
	// Tick is the plugin's tick period; 0 means DefaultTick. It only sets
	// the default Lease here: the plugin owns the tick.
	Tick time.Duration
	// Lease is how long the sync lease lasts without renewal; 0 means
	// max(MinLease, DefaultLeaseTicks × Tick). A dead holder's lease passes
	// to another worker within Lease plus one tick.
	Lease time.Duration
	// Compile are the options of rules.Compile for pulled policies.
	Compile rules.CompileOptions
	// Check, if set, vets a compiled policy beyond rules.Compile (e.g. that
	// its rules fit the plugin's counter layout); a policy it refuses is
	// rejected like an invalid one, and never published.
	Check func(*rules.Compiled) error
	// Prepare, if set, runs on the lease holder after Check and before the
	// policy is published, so it is done before any worker can apply the
	// policy (the plugin creates the policy's shared-data counter keys
	// there). An error leaves the policy unpublished; it is fetched again
	// after the backoff.
	Prepare func(*rules.Compiled) error
	// Apply installs a newly compiled policy, or nil when the policy was
	// deleted at the control plane (enforce none; see "Policy precedence"); it
	// runs between requests
	// (from a tick, a request's check, or the poll's response) and must
	// swap atomically. An error leaves the previous policy in use; the
	// Syncer logs it and does not retry that publication. Required.
	Apply func(*rules.Compiled) error
	// Host is the proxy; nil means ProxyWasm().
	Host Host
	// Now is the clock; nil means time.Now (in a VM, the host's clock).
	Now func() time.Time
	// Int64N is the jitter source for Backoff; nil means math/rand/v2.
	Int64N func(n int64) int64
	// VMToken identifies this plugin instance in the lease; 0 means a
	// random non-zero value from math/rand/v2.
	VMToken uint64
}

// withDefaults returns o with zero fields defaulted, or an error naming
// the first bad field.
func (o Options) withDefaults() (Options, error) {
	if !rules.ValidName(o.Policy) {
		return o, errors.New("policysync: policy " + strconv.Quote(o.Policy) + " is not a valid policy name")
	}
	if o.Apply == nil {
		return o, errors.New("policysync: Apply is required")
	}
	if o.Authority == "" {
		o.Authority = o.Cluster
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.Tick == 0 {
		o.Tick = DefaultTick
	}
	if o.Timeout == 0 {
		o.Timeout = o.Wait + max(time.Second, o.Wait/10)
	}
	if o.Lease == 0 {
		o.Lease = max(MinLease, DefaultLeaseTicks*o.Tick)
	}
	switch {
	case o.Wait < time.Millisecond:
		return o, errors.New("policysync: wait " + o.Wait.String() + " is below 1ms")
	case o.Tick < time.Millisecond:
		return o, errors.New("policysync: tick " + o.Tick.String() + " is below 1ms")
	case o.Timeout <= o.Wait:
		return o, errors.New("policysync: timeout " + o.Timeout.String() + " must exceed wait " + o.Wait.String())
	case o.Timeout.Milliseconds() > math.MaxInt32:
		return o, errors.New("policysync: timeout " + o.Timeout.String() + " exceeds 2^31-1 ms")
	case o.Lease < 2*o.Tick:
		return o, errors.New("policysync: lease " + o.Lease.String() + " must be at least two ticks (" + (2 * o.Tick).String() + ")")
	}
	if o.Host == nil {
		o.Host = ProxyWasm()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}
