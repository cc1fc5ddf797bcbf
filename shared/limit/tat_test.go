package limit

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestTokenBucket(t *testing.T) {
	ns := time.Nanosecond
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "5 per 15s: 6th denied, one token back every 3s",
			cfg:  Config{Algorithm: TokenBucket, Limit: 5, Window: 15 * sec},
			steps: []step{
				{0, 1, allow(5, 4, 3*sec)},
				{0, 1, allow(5, 3, 6*sec)},
				{0, 1, allow(5, 2, 9*sec)},
				{0, 1, allow(5, 1, 12*sec)},
				{0, 1, allow(5, 0, 15*sec)},
				{0, 1, deny(5, 0, 15*sec, 3*sec)},
				{3*sec - ns, 1, deny(5, 0, 12*sec+ns, ns)},
				{3 * sec, 1, allow(5, 0, 15*sec)},
				{6 * sec, 2, deny(5, 1, 12*sec, 3*sec)},
				{6 * sec, 6, deny(5, 1, 12*sec, Never)},
				{6 * sec, 0, allow(5, 1, 12*sec)},
				{60 * sec, 1, allow(5, 4, 3*sec)},
			},
		},
		{
			name: "burst below limit: capacity 2, refill 10 per 1s",
			cfg:  Config{Algorithm: TokenBucket, Limit: 10, Window: sec, Burst: 2},
			steps: []step{
				{0, 1, allow(2, 1, 100*ms)},
				{0, 1, allow(2, 0, 200*ms)},
				{50 * ms, 1, deny(2, 0, 150*ms, 50*ms)},
				{100 * ms, 1, allow(2, 0, 200*ms)},
				{time.Hour, 2, allow(2, 0, 200*ms)},
				{time.Hour, 3, deny(2, 0, 200*ms, Never)},
			},
		},
		{
			name: "3 per 7s: exact rational refill, no rounding drift",
			cfg:  Config{Algorithm: TokenBucket, Limit: 3, Window: 7 * sec},
			steps: []step{
				{0, 1, allow(3, 2, 2333333334*ns)},
				{0, 1, allow(3, 1, 4666666667*ns)},
				{0, 1, allow(3, 0, 7*sec)},
				{0, 1, deny(3, 0, 7*sec, 2333333334*ns)},
				{2333333333 * ns, 1, deny(3, 0, 4666666667*ns, ns)},
				{2333333334 * ns, 1, allow(3, 0, 7*sec)}, // debt 4666666666ns + 2333333333⅓ns → ceil 7s
				// three tokens refill in exactly 7s after the last (fractional) take
				{2333333334*ns + 7*sec - ns, 3, deny(3, 2, ns, ns)},
				{2333333334*ns + 7*sec, 3, allow(3, 0, 7*sec)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestGCRA(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "5 per 15s as burst 4: 5 at once, 6th denied, then one per 3s",
			cfg:  Config{Algorithm: GCRA, Limit: 5, Window: 15 * sec, Burst: 4},
			steps: []step{
				{0, 1, allow(5, 4, 3*sec)},
				{1 * ms, 1, allow(5, 3, 6*sec-1*ms)},
				{2 * ms, 1, allow(5, 2, 9*sec-2*ms)},
				{3 * ms, 1, allow(5, 1, 12*sec-3*ms)},
				{4 * ms, 1, allow(5, 0, 15*sec-4*ms)},
				{5 * ms, 1, deny(5, 0, 15*sec-5*ms, 3*sec-5*ms)},
				{3 * sec, 1, allow(5, 0, 15*sec)},
				{4 * sec, 1, deny(5, 0, 14*sec, 2*sec)},
			},
		},
		{
			name: "burst 0 (nginx default): one per 500ms, nothing at once",
			cfg:  Config{Algorithm: GCRA, Limit: 2, Window: sec},
			steps: []step{
				{0, 1, allow(1, 0, 500*ms)},
				{0, 1, deny(1, 0, 500*ms, 500*ms)},
				{499 * ms, 1, deny(1, 0, 1*ms, 1*ms)},
				{500 * ms, 1, allow(1, 0, 500*ms)},
				{500 * ms, 2, deny(1, 0, 500*ms, Never)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// nginxLimitReq is ngx_http_limit_req_module's per-node arithmetic (nodelay), from
// ngx_http_limit_req_lookup: excess in milli-requests, time in milliseconds, rate in
// milli-requests per second.
type nginxLimitReq struct {
	rate, burst int64 // burst in milli-requests
	excess      int64
	last        int64 // ms
	exists      bool
}

func (n *nginxLimitReq) request(nowMS int64) bool {
	if !n.exists {
		n.exists, n.excess, n.last = true, 0, nowMS
		return true
	}
	ms := nowMS - n.last
	excess := n.excess - n.rate*ms/1000 + 1000
	if excess < 0 {
		excess = 0
	}
	if excess > n.burst {
		return false
	}
	n.excess = excess
	if ms != 0 {
		n.last = nowMS
	}
	return true
}

// TestGCRAMatchesNginx replays random millisecond timelines through nginx's limit_req
// arithmetic and gcra with the same rate and burst: every decision must agree.
func TestGCRAMatchesNginx(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		rps := int64(1 + rng.IntN(20))
		burst := uint64(rng.IntN(6))
		ng := nginxLimitReq{rate: rps * 1000, burst: int64(burst) * 1000}
		l := mustNew(t, Config{Algorithm: GCRA, Limit: uint64(rps), Window: sec, Burst: burst})
		state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
		nowMS := int64(1_700_000_000_000)
		for i := 0; i < 200; i++ {
			nowMS += int64(rng.IntN(int(2000 / rps)))
			want := ng.request(nowMS)
			got := l.Decide(state, next, nowMS*int64(time.Millisecond), 1)
			if got.Allowed != want {
				t.Fatalf("trial %d (rate %d r/s, burst %d) request %d at %d ms: gcra %v, nginx %v",
					trial, rps, burst, i, nowMS, got.Allowed, want)
			}
			if got.Allowed {
				state, next = next, state
			}
		}
	}
}

func TestTATAdjust(t *testing.T) {
	l := mustNew(t, Config{Algorithm: TokenBucket, Limit: 10, Window: 10 * sec})
	st, nx := make([]byte, 16), make([]byte, 16)
	d := l.Decide(st, nx, t0, 4)
	if !d.Allowed || d.Remaining != 6 {
		t.Fatalf("Decide: %+v", d)
	}
	st, nx = nx, st
	// The response says it cost 9: charge 5 more.
	if !l.Adjust(st, nx, t0, 5) {
		t.Fatal("Adjust unsupported")
	}
	st, nx = nx, st
	if d := l.Decide(st, nx, t0, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after +5: %+v", d)
	}
	// Charge far more than capacity: debt is capped at one capacity (20s to refill).
	l.Adjust(st, nx, t0, 1_000_000)
	st, nx = nx, st
	if got := l.IdleAt(st, t0); got != t0+int64(20*sec) {
		t.Fatalf("IdleAt after big charge = %v, want +20s", time.Duration(got-t0))
	}
	// Refund more than was taken: the bucket is full, never above capacity.
	l.Adjust(st, nx, t0, -1_000_000)
	st, nx = nx, st
	if !l.Idle(st, t0) {
		t.Fatal("not idle after full refund")
	}
	if d := l.Decide(st, nx, t0, 10); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after refund: %+v", d)
	}
}

// TestTATIdleAtIsWhenTheDebtIsPaid: IdleAt, computed from the stored TAT
// without a division, is now + ceil(D/L) for the debt D the limiter reads
// (or the stored TAT rounded up when that is deeper than the deepest debt),
// for states the limiter wrote, states from the future and garbage alike.
func TestTATIdleAtIsWhenTheDebtIsPaid(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 5, Window: 15 * sec},
		{Algorithm: TokenBucket, Limit: 1000000007, Window: 3 * sec, Burst: 9},
		{Algorithm: GCRA, Limit: 7, Window: time.Hour, Burst: 3},
	} {
		tl := newTAT(c)
		want := func(state []byte, now int64) int64 { // the definition, with the division
			now = clampNow(now)
			hi, lo, over := tl.debt(state, now)
			idle := addSat(now, ceilDiv128(hi, lo, tl.limit))
			if over {
				at := int64(ld64(state, tatAt))
				if ld64(state, tatFrac) != 0 {
					at++
				}
				idle = max(idle, at)
			}
			return idle
		}
		now := int64(1_800_000_000_000_000_000)
		state := make([]byte, tatSize)
		for i := range 20000 {
			switch i % 3 {
			case 0: // what Decide writes
				next := make([]byte, tatSize)
				tl.Decide(state, next, now, 1+r.Uint64N(3))
				copy(state, next)
			case 1: // a TAT around now, up to beyond the deepest debt
				st64(state, tatAt, uint64(now+r.Int64N(int64(tl.maxAhead)*2+2)-int64(tl.maxAhead)/2))
				st64(state, tatFrac, r.Uint64N(tl.limit+2))
			default: // garbage
				st64(state, tatAt, r.Uint64())
				st64(state, tatFrac, r.Uint64())
			}
			at := now + r.Int64N(int64(2*sec)) - int64(sec)
			if got, w := tl.IdleAt(state, at), want(state, at); got != w {
				t.Fatalf("%v: IdleAt(tat %d frac %d, now %d) = %d, want %d", c, int64(ld64(state, tatAt)), ld64(state, tatFrac), at, got, w)
			}
			now += r.Int64N(int64(sec) / 10)
		}
	}
}
