package limit

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// Property tests: random request timelines (fixed seeds, bounded counts) run through
// each limiter and through a straightforward reference model of its documented
// semantics (exact rationals, full request lists). Every decision must agree, the
// admitted traffic must satisfy the algorithm's bound (brute-force checkers over every
// window), RetryAfter must be exact, and a probe or a denied request's next state must
// be equivalent to the state it came from.

// event is one admitted request.
type event struct {
	at   int64
	cost uint64
}

// model is a reference implementation: allow reports whether cost may pass at now and
// records it if so.
type model interface {
	allow(now int64, cost uint64) bool
}

// bucketModel is a token bucket over exact rationals: capacity C, refill L per W.
type bucketModel struct {
	c, l, w int64
	tokens  *big.Rat
	last    int64
}

func (m *bucketModel) allow(now int64, cost uint64) bool {
	if m.tokens == nil {
		m.tokens, m.last = big.NewRat(m.c, 1), now
	}
	refill := big.NewRat((now-m.last)*m.l, m.w)
	m.tokens.Add(m.tokens, refill)
	if m.tokens.Cmp(big.NewRat(m.c, 1)) > 0 {
		m.tokens.SetInt64(m.c)
	}
	m.last = now
	if m.tokens.Cmp(big.NewRat(int64(cost), 1)) < 0 {
		return false
	}
	m.tokens.Sub(m.tokens, big.NewRat(int64(cost), 1))
	return true
}

// listModel keeps every admitted request and admits iff inWindow-counted cost fits.
type listModel struct {
	limit  uint64
	events []event
	counts func(e event, now int64) bool // whether e counts against a request at now
}

func (m *listModel) allow(now int64, cost uint64) bool {
	var sum uint64
	for _, e := range m.events {
		if m.counts(e, now) {
			sum += e.cost
		}
	}
	if sum+cost > m.limit {
		return false
	}
	if cost > 0 {
		m.events = append(m.events, event{now, cost})
	}
	return true
}

type propCase struct {
	cfg   Config
	model func() model
	// bound checks the admitted events (in time order) and returns a description of
	// the first violation, or "".
	bound func(evs []event) string
}

func slotOf(now int64, c Config) int64 {
	hi, lo := mul64(uint64(now), uint64(c.Slots))
	q, _ := div128(hi, lo, uint64(c.Window))
	return int64(q)
}

func propCases() []propCase {
	var cases []propCase
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 6; i++ {
		l := uint64(1 + rng.IntN(8))
		w := time.Duration(50+rng.IntN(2000)) * time.Millisecond
		burst := uint64(rng.IntN(6))
		// token_bucket and gcra: at most capacity + L·t/W in any interval of length t.
		for _, alg := range []Algorithm{TokenBucket, GCRA} {
			c := Config{Algorithm: alg, Limit: l, Window: w, Burst: burst}
			capacity := int64(c.withDefaults().capacity())
			cases = append(cases, propCase{
				cfg:   c,
				model: func() model { return &bucketModel{c: capacity, l: int64(l), w: int64(w)} },
				bound: func(evs []event) string {
					for i := range evs {
						var sum int64
						for j := i; j < len(evs); j++ {
							sum += int64(evs[j].cost)
							// sum <= capacity + L·(tj-ti)/W
							if sum*int64(w) > capacity*int64(w)+int64(l)*(evs[j].at-evs[i].at) {
								return "interval exceeds capacity + rate·t"
							}
						}
					}
					return ""
				},
			})
		}
		// fixed_window: at most L per epoch-aligned window.
		fw := Config{Algorithm: FixedWindow, Limit: l, Window: w}
		cases = append(cases, propCase{
			cfg: fw,
			model: func() model {
				return &listModel{limit: l, counts: func(e event, now int64) bool { return e.at/int64(w) == now/int64(w) }}
			},
			bound: func(evs []event) string {
				sums := map[int64]uint64{}
				for _, e := range evs {
					if sums[e.at/int64(w)] += e.cost; sums[e.at/int64(w)] > l {
						return "window exceeds limit"
					}
				}
				return ""
			},
		})
		// time_wheel: at most L in any Slots consecutive slots.
		tw := Config{Algorithm: TimeWheel, Limit: l, Window: w, Slots: uint32(1 + rng.IntN(12))}
		cases = append(cases, propCase{
			cfg: tw,
			model: func() model {
				return &listModel{limit: l, counts: func(e event, now int64) bool {
					return slotOf(e.at, tw) > slotOf(now, tw)-int64(tw.Slots)
				}}
			},
			bound: func(evs []event) string {
				for i := range evs {
					var sum uint64
					for j := i; j < len(evs) && slotOf(evs[j].at, tw)-slotOf(evs[i].at, tw) < int64(tw.Slots); j++ {
						if sum += evs[j].cost; sum > l {
							return "Slots consecutive slots exceed limit"
						}
					}
				}
				return ""
			},
		})
		// sliding_log: at most L in any half-open interval of length W.
		sl := Config{Algorithm: SlidingLog, Limit: l, Window: w}
		cases = append(cases, propCase{
			cfg: sl,
			model: func() model {
				return &listModel{limit: l, counts: func(e event, now int64) bool { return e.at > now-int64(w) }}
			},
			bound: func(evs []event) string {
				for i := range evs {
					var sum uint64
					for j := i; j < len(evs) && evs[j].at-evs[i].at < int64(w); j++ {
						if sum += evs[j].cost; sum > l {
							return "interval of length W exceeds limit"
						}
					}
				}
				return ""
			},
		})
	}
	return cases
}

// decideFrom runs Decide without disturbing state.
func decideFrom(l Limiter, state []byte, now int64, cost uint64) Decision {
	next := make([]byte, l.StateSize())
	return l.Decide(state, next, now, cost)
}

func TestPropertyAgainstModels(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for ci, pc := range propCases() {
		l := mustNew(t, pc.cfg)
		for trial := 0; trial < 8; trial++ {
			m := pc.model()
			state := make([]byte, l.StateSize())
			next := make([]byte, l.StateSize())
			var admitted []event
			now := t0 + rng.Int64N(int64(time.Hour))
			w := int64(pc.cfg.Window)
			for i := 0; i < 150; i++ {
				switch rng.IntN(4) { // bursts, steady gaps, long idles
				case 0:
				case 1, 2:
					now += rng.Int64N(w / 4)
				default:
					now += rng.Int64N(2 * w)
				}
				cost := uint64(1)
				switch r := rng.IntN(10); {
				case r == 0:
					cost = 0
				case r < 3:
					cost = uint64(1 + rng.IntN(4))
				case r == 3:
					cost = pc.cfg.Limit + pc.cfg.Burst + 2 // never admissible
				}
				d := l.Decide(state, next, now, cost)
				want := m.allow(now, cost)
				if d.Allowed != want {
					t.Fatalf("case %d %+v trial %d req %d (cost %d at +%v): Allowed = %v, model says %v",
						ci, pc.cfg, trial, i, cost, time.Duration(now-t0), d.Allowed, want)
				}
				if d.Allowed {
					if d.RetryAfter != 0 {
						t.Fatalf("allowed with RetryAfter %v", d.RetryAfter)
					}
					state, next = next, state
					if cost > 0 {
						admitted = append(admitted, event{now, cost})
					}
				} else {
					checkRetryAfter(t, l, state, now, cost, d)
					// The denied request's next is equivalent: use it from now on.
					if rng.IntN(2) == 0 {
						state, next = next, state
					}
				}
				if rng.IntN(5) == 0 { // and so is a probe's
					p := make([]byte, l.StateSize())
					if !l.Decide(state, p, now, 0).Allowed && pc.cfg.Algorithm != TokenBucket {
						t.Fatalf("probe denied")
					}
					if pd := decideFrom(l, p, now, cost); pd != decideFrom(l, state, now, cost) {
						t.Fatalf("probe state differs: %+v vs %+v", pd, decideFrom(l, state, now, cost))
					}
					state = p
				}
			}
			if msg := pc.bound(admitted); msg != "" {
				t.Fatalf("case %d %+v trial %d: %s", ci, pc.cfg, trial, msg)
			}
		}
	}
}

// checkRetryAfter: with nothing else happening, the same request is denied 1ns before
// now+RetryAfter and allowed at it.
func checkRetryAfter(t *testing.T, l Limiter, state []byte, now int64, cost uint64, d Decision) {
	t.Helper()
	if d.RetryAfter == Never {
		if cost <= l.Config().withDefaults().Limit && l.Config().Algorithm != TokenBucket && l.Config().Algorithm != GCRA {
			t.Fatalf("Never for cost %d <= limit", cost)
		}
		return
	}
	if d.RetryAfter <= 0 {
		t.Fatalf("denied with RetryAfter %v", d.RetryAfter)
	}
	at := now + int64(d.RetryAfter)
	if !decideFrom(l, state, at, cost).Allowed {
		t.Fatalf("%v cost %d: still denied after RetryAfter %v", l.Config().Algorithm, cost, d.RetryAfter)
	}
	if decideFrom(l, state, at-1, cost).Allowed {
		t.Fatalf("%v cost %d: allowed 1ns before RetryAfter %v", l.Config().Algorithm, cost, d.RetryAfter)
	}
}

// TestPropertyConcurrency: with random stream durations and lost releases, the
// requests holding a slot (acquired, not released, lease not ended) never exceed
// Limit, and a request is denied only when Limit are held.
func TestPropertyConcurrency(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for trial := 0; trial < 40; trial++ {
		lim := uint64(1 + rng.IntN(6))
		lease := time.Duration(100+rng.IntN(1000)) * time.Millisecond
		l := mustNew(t, Config{Algorithm: Concurrency, Limit: lim, Lease: lease})
		state, next := make([]byte, l.StateSize()), make([]byte, l.StateSize())
		type stream struct {
			start, end int64 // end: release time, or -1 if the release is lost
			cost       uint64
			released   bool
		}
		var live []*stream
		now := t0
		for i := 0; i < 300; i++ {
			now += rng.Int64N(int64(lease) / 5)
			// Deliver the releases that are due, in time order of arrival.
			for _, s := range live {
				if !s.released && s.end >= 0 && s.end <= now {
					l.Release(state, next, s.end, s.start, s.cost)
					state, next = next, state
					s.released = true
				}
			}
			var held uint64
			for _, s := range live {
				if !s.released && now < s.start+int64(lease) {
					held += s.cost
				}
			}
			cost := uint64(1 + rng.IntN(2))
			d := l.Decide(state, next, now, cost)
			if want := held+cost <= lim; d.Allowed != want {
				t.Fatalf("trial %d req %d: held %d cost %d limit %d: Allowed = %v", trial, i, held, cost, lim, d.Allowed)
			}
			if d.Allowed {
				state, next = next, state
				s := &stream{start: now, end: now + rng.Int64N(int64(lease)*3/2), cost: cost}
				if rng.IntN(5) == 0 {
					s.end = -1 // the stream end is lost
				}
				live = append(live, s)
			} else if d.RetryAfter != Never {
				checkRetryAfter(t, l, state, now, cost, d)
			}
		}
	}
}

// TestAnyBytesNeverPanic: every method accepts arbitrary state bytes of any length.
func TestAnyBytesNeverPanic(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for _, c := range allConfigs() {
		l := mustNew(t, c)
		next := make([]byte, l.StateSize())
		for i := 0; i < 2000; i++ {
			n := l.StateSize()
			if rng.IntN(8) == 0 {
				n = rng.IntN(2 * l.StateSize())
			}
			state := make([]byte, n)
			for j := range state {
				state[j] = byte(rng.Uint32())
				if rng.IntN(3) == 0 {
					state[j] = 0
				}
			}
			a, b := rng.Int64(), rng.Int64() // two draws: any sign, any magnitude
			now := a - b
			exercise(l, state, next, now, rng.Uint64()>>rng.IntN(64), rng.Int64()>>rng.IntN(64))
		}
	}
}

// exercise calls every method once; it is shared by the fuzz targets.
func exercise(l Limiter, state, next []byte, now int64, cost uint64, delta int64) {
	d := l.Decide(state, next, now, cost)
	if d.Allowed && d.RetryAfter != 0 {
		panic("allowed with RetryAfter")
	}
	if d.Reset < 0 || d.RetryAfter < 0 || d.Remaining > d.Limit {
		panic("negative Reset/RetryAfter or Remaining > Limit")
	}
	l.Adjust(state, next, now, delta)
	l.Release(state, next, now, now-int64(cost), cost)
	if l.Idle(state, now) != (l.IdleAt(state, now) == clampNow(now)) {
		panic("Idle and IdleAt disagree")
	}
	if l.IdleAt(state, now) < clampNow(now) {
		panic("IdleAt before now")
	}
}

func allConfigs() []Config {
	return []Config{
		{Algorithm: TokenBucket, Limit: 5, Window: 15 * time.Second},
		{Algorithm: TokenBucket, Limit: MaxLimit, Window: MinWindow, Burst: MaxLimit},
		{Algorithm: GCRA, Limit: 3, Window: 7 * time.Second, Burst: 2},
		{Algorithm: TimeWheel, Limit: 100, Window: 10 * time.Second},
		{Algorithm: TimeWheel, Limit: MaxWheelLimit, Window: MaxWindow, Slots: MaxSlots},
		{Algorithm: FixedWindow, Limit: 3, Window: 5 * time.Second},
		{Algorithm: FixedWindow, Limit: 3, CalendarDay: true, Location: time.FixedZone("X", -5*3600)},
		{Algorithm: SlidingLog, Limit: 5, Window: 15 * time.Second},
		{Algorithm: Concurrency, Limit: 4, Lease: time.Second},
	}
}
