package limit

import "time"

// token_bucket and gcra.
//
// Both are one algorithm, kept exact by tracking a theoretical arrival time (TAT) in
// rational nanoseconds: with rate Limit per Window, each cost unit advances the TAT by
// Window/Limit ns. The "debt" D = max(0, TAT-now), measured in ticks of 1/Limit ns, is
// what the bucket lacks from full: a unit costs Window ticks, refill is Limit ticks per
// ns, and a request of cost c is admitted iff D + c·Window <= capacity·Window. All of it
// is 128-bit integer arithmetic: no float drift, no rounding of Window/Limit.
//
// token_bucket: a bucket of capacity Burst (default Limit) cost units, full for a fresh
// key, refilled continuously at Limit units per Window; a request of cost c takes c
// tokens if at least c are present, else it is denied and takes nothing. Over any time
// interval of length t it admits at most Burst + Limit·t/Window units. This follows
// Envoy's local_ratelimit token_bucket {max_tokens = Burst, tokens_per_fill = Limit,
// fill_interval = Window}
// (https://www.envoyproxy.io/docs/envoy/latest/api-v3/type/v3/token_bucket.proto), with
// one deliberate difference: Envoy's classic bucket adds tokens_per_fill in discrete
// fills at every fill_interval, while this bucket refills continuously (Envoy's
// AtomicTokenBucket, and x/time/rate, do the same). Discrete fills admit a burst of
// max_tokens + tokens_per_fill right across a fill and make the schedule depend on when
// the first fill timer started, which differs between workers; continuous refill has
// the tighter bound above and needs no timer.
//
// gcra: the Generic Cell Rate Algorithm (ATM Forum TM 4.0 "virtual scheduling", the
// leaky bucket as a meter) with emission interval T = Window/Limit and burst tolerance
// τ = Burst·T, with nginx limit_req nodelay semantics
// (https://nginx.org/en/docs/http/ngx_http_limit_req_module.html): requests beyond the
// burst are rejected, never delayed (a filter has no queue). A request is admitted iff
// TAT - now <= τ, then TAT = max(TAT, now) + cost·T. So a fresh key admits Burst+1
// requests at once and then one per T: nginx's "burst=5" admits 6 at once, exactly as
// its excess counter does (excess 0 for the first, 1..5 for the burst, 6 > burst
// rejected). That is a token bucket of capacity Burst+1, which is how it is computed;
// over any interval of length t gcra admits at most Burst+1 + Limit·t/Window units.
// nginx counts in milliseconds; this counts in exact rational nanoseconds.
//
// Both report Decision.Limit = capacity (Burst for token_bucket, Burst+1 for gcra),
// Remaining = whole units left in the bucket, Reset = time until the bucket is full,
// RetryAfter = time until cost units are available.
//
// Adjust(delta): delta > 0 takes delta more units (the bucket may go into debt, at most
// one capacity below empty: further charges are dropped); delta < 0 puts |delta| units
// back (never above capacity).
//
// State layout (16 bytes, little-endian):
//
//	[0:8]  tat   int64   theoretical arrival time, integer Unix nanoseconds (0 = fresh)
//	[8:16] frac  uint64  fractional part of tat in units of 1/Limit ns, < Limit
//
// The deepest debt a state is written with is 2·capacity units (2·capacity·Window/Limit
// ns of TAT ahead of the writer's now). A reader's clock may read earlier than the
// writer's (it read the clock first and commits after), so a TAT up to tatSkew further
// ahead is believed and clamped to the deepest debt: the key stays empty, and a
// denied decision or a further charge leaves the stored TAT as it is. Only a state
// with frac >= Limit, or a tat beyond now + 2·capacity·Window/Limit + tatSkew, cannot
// have been written by this limiter and reads as fresh.
type tat struct {
	base
	limit    uint64 // L, ticks per ns
	window   uint64 // W, ticks per cost unit
	capacity uint64 // C, cost units
	capHi    uint64 // C·W (ticks), 128-bit
	capLo    uint64
	maxHi    uint64 // 2·C·W, the deepest debt
	maxLo    uint64
	maxAhead uint64 // ceil(2·C·W/L) + tatSkew: the furthest a believable TAT is ahead, ns
	// narrow: every value Decide computes fits in 64 bits, so it decides in
	// 64-bit arithmetic (see narrowFits).
	narrow bool
}

// A token_bucket or gcra state, field by field (little-endian); offsets and
// size follow from the list.
const (
	tatAt   = 0           // int64: the theoretical arrival time, Unix ns
	tatFrac = tatAt + 8   // uint64: the ticks of the TAT below one ns
	tatSize = tatFrac + 8 // 16 bytes
)

func newTAT(c Config) *tat {
	t := &tat{base: newBase(c), limit: c.Limit, window: uint64(c.Window), capacity: c.capacity()}
	t.capHi, t.capLo = mul64(t.capacity, t.window)
	t.maxHi, t.maxLo = add128(t.capHi, t.capLo, t.capHi, t.capLo)
	t.maxAhead = ceilDiv128(t.maxHi, t.maxLo, t.limit) + uint64(tatSkew) // <= 2·MaxRefill + tatSkew
	t.narrow = narrowFits(t.capHi, t.capLo, t.maxAhead, t.limit, t.window)
	return t
}

// narrowFits reports whether a bucket of C·W = (capHi, capLo) ticks whose
// TATs are believed up to maxAhead ns ahead at limit L ticks per ns decides
// in 64-bit arithmetic: a decoded debt is at most (maxAhead+1)·L, a debt
// with a request's cost added at most 3·C·W (2·C·W clamped, plus at most
// C·W), and both must stay below 2^64: a capacity times the window in ns
// below about 6·10^18, so up to about 10^8 a minute, 1.7·10^6 an hour or
// 71,000 a day (1,000 a minute: C·W = 6·10^13 ticks). A larger bucket (10^9 a
// minute: C·W = 6·10^19; 10^6 a day: 8.64·10^19) keeps the 128-bit
// arithmetic. A zero limit or window (never
// valid) is not narrow.
func narrowFits(capHi, capLo, maxAhead, limit, window uint64) bool {
	if limit == 0 || window == 0 || capHi != 0 || capLo > (1<<64-1)/3 || maxAhead == 1<<64-1 {
		return false
	}
	hi, _ := mul64(maxAhead+1, limit)
	return hi == 0
}

// StateSize is 16 bytes.
func (t *tat) StateSize() int { return tatSize }

// debt decodes state at now into D = max(0, tat-now)·L + frac ticks (128-bit),
// clamped to the deepest debt 2·C·W; over reports that the stored debt was deeper (by
// at most tatSkew of clock: see the type comment) and was clamped. Garbage reads as 0.
func (t *tat) debt(state []byte, now int64) (hi, lo uint64, over bool) {
	if len(state) != tatSize {
		return 0, 0, false
	}
	at := int64(ld64(state, tatAt))
	frac := ld64(state, tatFrac)
	if frac >= t.limit || at < now || (at == now && frac == 0) || uint64(at-now) > t.maxAhead {
		return 0, 0, false
	}
	hi, lo = mul64(uint64(at-now), t.limit)
	hi, lo = add128(hi, lo, 0, frac)
	if cmp128(hi, lo, t.maxHi, t.maxLo) > 0 {
		return t.maxHi, t.maxLo, true
	}
	return hi, lo, false
}

// encode writes the state whose debt at now is D ticks.
func (t *tat) encode(next []byte, now int64, hi, lo uint64) {
	if hi == 0 && lo == 0 {
		st64(next, tatAt, 0)
		st64(next, tatFrac, 0)
		return
	}
	q, r := div128(hi, lo, t.limit)
	st64(next, tatAt, uint64(addSat(now, q)))
	st64(next, tatFrac, r)
}

// report fills Remaining and Reset for debt D at now.
func (t *tat) report(d *Decision, hi, lo uint64) {
	d.Limit = t.capacity
	rhi, rlo := sub128(t.capHi, t.capLo, hi, lo)
	d.Remaining, _ = div128(rhi, rlo, t.window)
	d.Reset = dur(ceilDiv128(hi, lo, t.limit))
}

// Decide admits cost units iff they are in the bucket now; see the type comment.
//
// A narrow bucket (narrowFits) decides here in 64-bit arithmetic, where the
// 128-bit one (decideWide) costs a function call per operation and a long
// multiplication under wasm: its values are the 128-bit ones with a zero high
// word, and a test compares the two on random states.
func (t *tat) Decide(state, next []byte, now int64, cost uint64) Decision {
	now = clampNow(now)
	if !t.narrow {
		return t.decideWide(state, next, now, cost)
	}
	// The debt, as debt computes it.
	var d uint64
	over := false
	if len(state) == tatSize {
		at := int64(ld64(state, tatAt))
		frac := ld64(state, tatFrac)
		if frac < t.limit && (at > now || (at == now && frac != 0)) && uint64(at-now) <= t.maxAhead {
			d = uint64(at-now)*t.limit + frac
			if d > t.maxLo {
				d, over = t.maxLo, true
			}
		}
	}
	var dec Decision
	if cost <= t.capacity {
		n := d + cost*t.window
		if n <= t.capLo {
			t.encode64(next, now, n)
			dec.Allowed = true
			t.report64(&dec, n)
			return dec
		}
		e := n - t.capLo
		wait := e / t.limit
		if e%t.limit != 0 {
			wait++
		}
		dec.RetryAfter = dur(wait)
	} else {
		dec.RetryAfter = Never
	}
	if over {
		copy(next[:tatSize], state) // keep the deeper stored debt
	} else {
		t.encode64(next, now, d)
	}
	t.report64(&dec, d)
	return dec
}

// decideWide is Decide (now already clamped) in 128-bit arithmetic, for a
// bucket that is not narrow.
func (t *tat) decideWide(state, next []byte, now int64, cost uint64) Decision {
	hi, lo, over := t.debt(state, now)
	var d Decision
	if cost <= t.capacity {
		chi, clo := mul64(cost, t.window)
		nhi, nlo := add128(hi, lo, chi, clo)
		if cmp128(nhi, nlo, t.capHi, t.capLo) <= 0 {
			t.encode(next, now, nhi, nlo)
			d.Allowed = true
			t.report(&d, nhi, nlo)
			return d
		}
		// Wait until D - wait·L <= (C-cost)·W, i.e. wait = ceil((D + cost·W - C·W)/L).
		ehi, elo := sub128(nhi, nlo, t.capHi, t.capLo)
		d.RetryAfter = dur(ceilDiv128(ehi, elo, t.limit))
	} else {
		d.RetryAfter = Never
	}
	if over {
		copy(next[:tatSize], state) // keep the deeper stored debt
	} else {
		t.encode(next, now, hi, lo)
	}
	t.report(&d, hi, lo)
	return d
}

// encode64 is encode for a debt of d ticks below 2^64.
func (t *tat) encode64(next []byte, now int64, d uint64) {
	if d == 0 {
		st64(next, tatAt, 0)
		st64(next, tatFrac, 0)
		return
	}
	st64(next, tatAt, uint64(addSat(now, d/t.limit)))
	st64(next, tatFrac, d%t.limit)
}

// report64 is report for a debt of d ticks below 2^64.
func (t *tat) report64(dec *Decision, d uint64) {
	dec.Limit = t.capacity
	if d < t.capLo {
		dec.Remaining = (t.capLo - d) / t.window
	}
	reset := d / t.limit
	if d%t.limit != 0 {
		reset++
	}
	dec.Reset = dur(reset)
}

// Adjust charges (delta > 0) or refunds (delta < 0) delta units; see the type comment.
func (t *tat) Adjust(state, next []byte, now int64, delta int64) bool {
	now = clampNow(now)
	hi, lo, over := t.debt(state, now)
	if delta >= 0 && over {
		copy(next[:tatSize], state) // already deeper than the deepest debt
		return true
	}
	if delta >= 0 {
		chi, clo := mul64(uint64(delta), t.window)
		hi, lo = add128(hi, lo, chi, clo)
		if chi > t.maxHi || cmp128(hi, lo, t.maxHi, t.maxLo) > 0 {
			hi, lo = t.maxHi, t.maxLo
		}
	} else {
		chi, clo := mul64(uint64(-(delta+1))+1, t.window)
		hi, lo = sub128(hi, lo, chi, clo)
	}
	t.encode(next, now, hi, lo)
	return true
}

// Release is not supported: it copies state to next and returns false.
func (t *tat) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool {
	copyState(state, next, tatSize)
	return false
}

// Idle reports whether the bucket is full at now.
func (t *tat) Idle(state []byte, now int64) bool {
	hi, lo, _ := t.debt(state, clampNow(now))
	return hi == 0 && lo == 0
}

// IdleAt returns when the bucket is full again: now + ceil(D/L), or the stored TAT
// (rounded up) when it is deeper than the deepest debt.
//
// With a debt D = (tat−now)·L + frac (frac < L), ceil(D/L) = tat−now, plus one
// if frac > 0: so a state the limiter believes is idle at its TAT rounded up,
// with no division (clamping a deeper debt changes nothing: the stored TAT is
// later than the clamped one), and a state it reads as fresh at now.
func (t *tat) IdleAt(state []byte, now int64) int64 {
	now = clampNow(now)
	if len(state) != tatSize {
		return now
	}
	at := int64(ld64(state, tatAt))
	frac := ld64(state, tatFrac)
	if frac >= t.limit || at < now || uint64(at-now) > t.maxAhead {
		return now // fresh, or not this limiter's state (debt reads it as 0)
	}
	if frac != 0 {
		return addSat(at, 1)
	}
	return at
}

// tatSkew is how far beyond the deepest debt a stored TAT is still believed (and
// clamped to the deepest debt) rather than read as garbage: a worker's clock reading
// may be older than the commit it decides on by a delay this long.
const tatSkew = time.Minute
