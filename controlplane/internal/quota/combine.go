package quota

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/shared/quota"
)

// Contention on one counter key is queued, not refused. Within a replica every ask
// for a storage key joins the key's queue; one ask at a time leads a round for the
// key: it takes every ask queued so far, loads the key once, decides the asks one
// after another on the evolving value (each decision's output is the next one's
// input, at one instant), and writes the result back with one compare-and-swap. Asks
// that arrive during a round wait for the next, which the first of them leads
// (group commit). However many Envoys share a hot key, a replica makes one Load and
// one Swap per round, and its own rounds never conflict with each other.
//
// Between replicas a conflicting swap (another replica wrote the key since the load)
// costs a retry of the round with everything in it, not an answer. A round that has
// not completed by its deadline answers its asks quota.StatusRetry: nothing was
// granted, returned or recorded for them. So does an ask still queued when its own
// request's deadline passes. Only an error of the backend itself (Load or Swap
// returned one) is an outage: the asks of that round fail and their requests are
// answered 503.
//
// A request whose keys no other request is deciding leads all of them in one round,
// so its loads and swaps stay one pipelined batch each, as without queueing.

// retryAfterContended is the RetryAfter of a StatusRetry answer: soon, as the key is
// being decided by other rounds and will be free again within a round trip or two.
const retryAfterContended = 5 * time.Millisecond

const combinerShards = 64

// combiner holds the queue of each storage key being decided by this replica.
type combiner struct {
	seed   maphash.Seed
	shards [combinerShards]combinerShard
}

type combinerShard struct {
	mu sync.Mutex
	// keys holds, for every key with a round under way or about to start, the
	// asks waiting for its next round, in arrival order (nil for none); a key
	// absent from the map is idle.
	keys map[string][]*keyAsk
}

// Ask states, changed under the key's shard lock.
const (
	askQueued = iota // waiting for a round
	askLead          // promoted: its own goroutine leads the next round
	askTaken         // in a round under way
	askDone          // answered (res or err)
)

// keyAsk is one key of one request.
type keyAsk struct {
	w        work
	envoy    string // the ledger entry's name: owner then the request's "envoy"
	owner    string // identity prefix (Owner), "" without identities
	k        *quota.KeyRequest
	interval time.Duration
	ao       *assignOpts // nil for the filter's leases

	state int
	wake  chan struct{} // its request's, capacity 1: an ask promoted or answered
	res   quota.KeyResult
	err   error
	at    int64  // the service clock its round decided at
	tag   uint64 // the window or slot it was decided in (fleetLimiter.tag)
}

func newCombiner() *combiner {
	c := &combiner{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].keys = make(map[string][]*keyAsk)
	}
	return c
}

func (c *combiner) shard(key string) *combinerShard {
	return &c.shards[maphash.String(c.seed, key)%combinerShards]
}

// enqueue registers a: it reports true when no round for a's key is under way, so
// the caller leads one for it now (a is then taken), false when a is queued.
func (c *combiner) enqueue(a *keyAsk) bool {
	sh := c.shard(a.w.skey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q, busy := sh.keys[a.w.skey]
	if !busy {
		sh.keys[a.w.skey] = nil
		a.state = askTaken
		return true
	}
	sh.keys[a.w.skey] = append(q, a)
	a.state = askQueued
	return false
}

// take removes and returns every ask queued for key (the promoted one first), all
// marked taken.
func (c *combiner) take(key string) []*keyAsk {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	batch := sh.keys[key]
	sh.keys[key] = nil
	for _, a := range batch {
		a.state = askTaken
	}
	return batch
}

// handOff ends a round of key: the key becomes idle, or the first ask queued for
// it is promoted to lead the next round.
func (c *combiner) handOff(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.keys[key]
	if len(q) == 0 {
		delete(sh.keys, key)
		return
	}
	next := q[0]
	next.state = askLead
	signal(next.wake)
}

// finish marks a answered and wakes its request.
func (c *combiner) finish(a *keyAsk) {
	sh := c.shard(a.w.skey)
	sh.mu.Lock()
	a.state = askDone
	sh.mu.Unlock()
	signal(a.wake)
}

// abandon answers a retry if it is still queued (its request's deadline passed
// before a round took it) and reports whether it did. An ask already taken or
// promoted is not abandoned: its round's answer is the one recorded.
func (c *combiner) abandon(a *keyAsk) bool {
	sh := c.shard(a.w.skey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if a.state != askQueued {
		return false
	}
	q := sh.keys[a.w.skey]
	for i, b := range q {
		if b == a {
			sh.keys[a.w.skey] = append(q[:i], q[i+1:]...)
			break
		}
	}
	a.state = askDone
	a.res = quota.KeyResult{Key: a.k.Key, Status: quota.StatusRetry, RetryAfter: retryAfterContended}
	return true
}

func (c *combiner) stateOf(a *keyAsk) int {
	sh := c.shard(a.w.skey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return a.state
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// group is one key's asks in a round.
type group struct {
	key  string
	f    *fleetLimiter
	asks []*keyAsk
	one  [1]*keyAsk // asks of a round led on arrival: no queue, one ask
}

// decideAll answers the asks of one request: it leads a round for the keys nobody
// is deciding, then waits for the others until deadline, leading the rounds it is
// promoted to. An ask still queued at deadline, or when ctx ends, is answered
// StatusRetry. The request's asks share one wake channel, so a promotion of any of
// them is acted on at once, whichever the request was waiting for (two requests
// each queued behind the other's promoted ask would otherwise wait for each other).
func (s *Service) decideAll(ctx context.Context, asks []keyAsk, deadline time.Time) {
	wake := make(chan struct{}, 1)
	var lead []group
	queued := false
	for i := range asks {
		a := &asks[i]
		a.wake = wake
		if s.comb.enqueue(a) {
			lead = append(lead, group{key: a.w.skey, f: a.w.f, one: [1]*keyAsk{a}})
		} else {
			queued = true
		}
	}
	if len(lead) > 0 {
		for i := range lead {
			lead[i].asks = lead[i].one[:]
		}
		s.round(lead)
	}
	if !queued {
		return // every ask was in that round, which answered it
	}
	var timer *time.Timer
	expired := false
	for {
		waiting := 0
		for i := range asks {
			a := &asks[i]
			switch s.comb.stateOf(a) {
			case askLead:
				s.round([]group{{key: a.w.skey, f: a.w.f, asks: s.comb.take(a.w.skey)}})
			case askQueued:
				if expired && s.comb.abandon(a) {
					s.m.queueTimeouts.Inc()
					continue
				}
				waiting++
			case askTaken:
				waiting++
			}
		}
		if waiting == 0 {
			break
		}
		if expired {
			<-wake // every ask left is in a round (or just promoted): it answers
			continue
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
			defer timer.Stop()
		}
		select {
		case <-wake:
		case <-timer.C:
			expired = true
		case <-ctx.Done():
			expired = true
		}
	}
}

// round decides groups, one key each, with one pipelined Load and one pipelined Swap
// per attempt, retrying the groups whose swap conflicted until s.o.Timeout has
// passed; then it answers every ask and hands each key to its next round. Each
// backend call has its own Timeout, detached from the request that leads the round
// (whose caller may go away): the round also answers asks of other requests.
func (s *Service) round(gs []group) {
	start := time.Now()
	pending := gs
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt > 0 {
			s.m.casRetries.Add(float64(len(pending)))
			if time.Since(start) >= s.o.Timeout {
				for _, g := range pending {
					for _, a := range g.asks {
						a.res = quota.KeyResult{Key: a.k.Key, Status: quota.StatusRetry, RetryAfter: retryAfterContended}
					}
				}
				s.m.roundTimeouts.Add(float64(len(pending)))
				break
			}
		}
		if err := s.attempt(&pending); err != nil {
			for _, g := range pending {
				for _, a := range g.asks {
					a.err = err
				}
			}
			break
		}
	}
	for _, g := range gs {
		for _, a := range g.asks {
			s.comb.finish(a)
		}
		s.comb.handOff(g.key)
	}
}

// attempt loads, decides and swaps the pending groups once; it leaves in pending the
// groups whose swap conflicted. A group reads the key's header, its askers'
// entries and their identities' entry counts, and now and then a part of the
// key's other entries to forget those of Envoys that stopped reporting (sweeps).
func (s *Service) attempt(pending *[]group) error {
	gs := *pending
	ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
	defer cancel()
	reads := make([]Read, len(gs))
	snaps := make([]Snapshot, len(gs))
	cached := make([]bool, len(gs))
	var load []Read
	for j, g := range gs {
		reads[j] = s.readOf(g)
		if cached[j] = s.reads.fill(reads[j], &snaps[j]); !cached[j] {
			load = append(load, reads[j])
		}
	}
	if len(load) > 0 {
		loaded, err := s.o.Backend.Load(ctx, load)
		if err != nil {
			return err
		}
		i := 0
		for j := range gs {
			if !cached[j] {
				snaps[j] = loaded[i]
				s.reads.loaded(reads[j], loaded[i])
				i++
			}
		}
	}
	s.m.readsSkipped.Add(float64(len(gs) - len(load)))
	s.m.rounds.Add(float64(len(gs)))
	now := s.o.Now()
	ops := make([]Op, 0, len(gs))
	opOf := make([]int, len(gs)) // index in ops, -1 for an unchanged key
	for j, g := range gs {
		opOf[j] = -1
		if op, changed := s.decideKey(g, reads[j], snaps[j], now); changed {
			opOf[j] = len(ops)
			ops = append(ops, op)
		}
	}
	var applied []bool
	if len(ops) > 0 {
		var err error
		if applied, err = s.o.Backend.Swap(ctx, ops); err != nil {
			for j := range gs {
				s.reads.forget(gs[j].key)
			}
			return err
		}
	}
	next := gs[:0:0]
	for j, g := range gs {
		switch {
		case opOf[j] >= 0 && applied[opOf[j]]:
			s.reads.wrote(ops[opOf[j]])
		case opOf[j] >= 0 || cached[j]:
			// A conflict, or a decision from the cache that wrote nothing
			// (its answer was never compared with the stored header): read
			// the key and decide again.
			s.reads.forget(g.key)
			next = append(next, g)
		}
	}
	*pending = next
	return nil
}

// readOf is what a round reads of g's key: the header, the entry of every
// asking Envoy and the count of every asking identity, and a page of entries
// for the sweep when one is due.
func (s *Service) readOf(g group) Read {
	fields := make([]string, 0, len(g.asks)+1)
	seen := map[string]bool{}
	for _, a := range g.asks {
		fields = append(fields, entryPrefix+a.envoy)
	}
	for _, a := range g.asks {
		if a.owner != "" && !seen[a.owner] {
			seen[a.owner] = true
			fields = append(fields, ownerPrefix+a.owner)
		}
	}
	return Read{Key: g.key, Fields: fields, Scan: s.sweeps.due(g.key)}
}

// decideKey decides every ask of g on the ledger read (rd, snap) at now: the
// due sweep, then each ask in turn. It returns the write of the key, and false
// when nothing changed (an unchanged key is not written: its value keeps its
// own expiry) or the header does not decode (the asks fail: failUndecodable).
func (s *Service) decideKey(g group, rd Read, snap Snapshot, now int64) (Op, bool) {
	h, err := g.f.load(snap.Header)
	if err != nil {
		s.failUndecodable(g, len(snap.Header), err)
		return Op{}, false
	}
	// The until its write set the key's expiry from (store): decided then at
	// its latest decision or later, so no later than that write's.
	var prev int64
	if len(snap.Header) > 0 {
		prev = g.f.until(&h, h.latest)
	}
	l := newLedger(h)
	l.maxEntries = uint32(min(s.o.MaxEntriesPerKey, 1<<31))
	l.windowed = g.f.validity == 0
	for i, f := range rd.Fields {
		v := snap.Fields[i]
		if name, ok := cutPrefix(f, entryPrefix); ok {
			if e, ok := decodeEntry(v, l.windowed); ok {
				l.entries[name] = &e
			}
		} else if o, ok := cutPrefix(f, ownerPrefix); ok {
			n, _ := strconv.ParseInt(string(v), 10, 64)
			l.owners[o] = n
		}
	}
	changed := false
	if rd.Scan.Count > 0 {
		if n := l.sweep(snap.Scanned, keyNow(&l.header, now), s.pressure(l, g.asks)); n > 0 {
			s.m.evictions.Add(float64(n))
		}
		changed = len(l.dirty) > 0 || len(l.removed) > 0
	}
	for _, a := range g.asks {
		changed = s.decideAsk(g, l, a, now) || changed
	}
	s.sweeps.after(g.key, l.count, l.sweepSoon, snap.Cursor, rd.Scan.Count > 0)
	if !changed {
		return Op{}, false
	}
	return s.writeOf(g, l, snap.Header, now, prev), true
}

// decideAsk decides one ask a of g on l at now into a.res, and reports
// whether l changed.
func (s *Service) decideAsk(g group, l *ledger, a *keyAsk, now int64) bool {
	if a.owner != "" && l.entries[a.envoy] == nil && l.owners[a.owner] >= int64(s.o.MaxEntriesPerIdentity) {
		// The identity holds its most entries on the key: the newcomer waits
		// for the sweep to forget one whose Envoy stopped reporting; no lease
		// in use is cut.
		a.res = quota.KeyResult{Key: a.k.Key, Status: quota.StatusRetry, RetryAfter: max(a.interval, time.Second)}
		a.at, a.tag = now, g.f.tag(l.state)
		l.sweepSoon = true
		s.m.identityFull.Inc()
		return false
	}
	res, changed := g.f.decide(l, now, a.envoy, a.k, a.interval, a.ao)
	a.res = res
	if a.res.Status == quota.StatusRetry {
		s.m.keyFull.Inc() // decide answers retry only for a ledger full of entries
	}
	a.at, a.tag = now, g.f.tag(l.state)
	return changed
}

// writeOf is the write of g's key after a round changed l: the header (old,
// the one read, is the compare-and-swap's witness; prev its until, store), the
// changed and removed entries, and the identities' count changes.
func (s *Service) writeOf(g group, l *ledger, old []byte, now, prev int64) Op {
	next, ttl := g.f.store(&l.header, now, prev)
	op := Op{Key: g.key, Old: old, New: next, TTL: ttl, Del: make([]string, 0, len(l.removed))}
	for name := range l.dirty {
		op.Set = append(op.Set, Field{Name: entryPrefix + name, Value: l.entries[name].encode(l.windowed)})
	}
	for _, name := range l.removed {
		op.Del = append(op.Del, entryPrefix+name)
	}
	for o, by := range l.adds {
		if by != 0 {
			op.Add = append(op.Add, Delta{Name: ownerPrefix + o, By: by})
		}
	}
	return op
}

// failUndecodable fails the asks of g, whose stored header of size bytes does
// not decode (err): nothing is decided or written for the key, its asks fail as an
// outage of the store would (503), each round is counted, and the operator is
// told at most every 10 s (a fleet asks about a key many times a second).
func (s *Service) failUndecodable(g group, size int, err error) {
	s.m.corrupt.Inc()
	if now := time.Now().UnixNano(); now-s.lastCorruptLog.Load() >= int64(10*time.Second) {
		s.lastCorruptLog.Store(now)
		s.log.Error("quota: a counter key's stored header does not decode; its asks are answered 503 until it expires or is deleted",
			"key", g.key, "bytes", size)
	}
	for _, a := range g.asks {
		a.err = fmt.Errorf("%w: key %s", err, g.key)
	}
}

// pressure says which entries a sweep may forget early, for the askers of a
// round that need room: a newcomer to a key at its most entries makes room from
// any entry that can give way (all), a newcomer whose identity is at its most
// entries makes room from that identity's entries only (owners). An asker with
// an entry, or with room, puts no pressure on anyone's entries.
func (s *Service) pressure(l *ledger, asks []*keyAsk) sweepPressure {
	var p sweepPressure
	for _, a := range asks {
		if l.entries[a.envoy] != nil {
			continue
		}
		if l.count >= l.maxEntries {
			p.all = true
		}
		if a.owner != "" && l.owners[a.owner] >= int64(s.o.MaxEntriesPerIdentity) {
			if p.owners == nil {
				p.owners = map[string]bool{}
			}
			p.owners[a.owner] = true
		}
	}
	return p
}

// sweeper schedules the sweeps of this replica: a key holding more than
// sweepFrom entries is swept about once a second, a part of about a sixteenth of
// its entries each time, so that every entry is looked at within half a minute
// or so (two replicas sweep independently); a key a newcomer found full at its
// next round. Keys are remembered up to maxSwept; past that the map starts over.
type sweeper struct {
	mu   sync.Mutex
	keys map[string]*sweepState
	now  func() int64 // the service clock, Unix ns
}

type sweepState struct {
	next   int64
	cursor string
	count  uint32
}

const (
	sweepFrom  = 16
	sweepEvery = time.Second
	maxSwept   = 1 << 14
	// sweepMost bounds one sweep's fields (HSCAN's COUNT is a hint).
	sweepMost = 1024
)

// due returns the scan a round of key should make: none (Count 0) unless one is due.
func (w *sweeper) due(key string) Scan {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.keys[key]
	if st == nil || w.now() < st.next {
		return Scan{}
	}
	return Scan{Cursor: st.cursor, Count: int(min(max(64, st.count/16), sweepMost))}
}

// after records a round of key: its entry count, whether a newcomer found it
// full (soon), and, if it scanned, the cursor to go on from.
func (w *sweeper) after(key string, count uint32, soon bool, cursor string, scanned bool) {
	if count <= sweepFrom && !soon {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.keys[key]
	if st == nil {
		if w.keys == nil || len(w.keys) >= maxSwept {
			w.keys = map[string]*sweepState{}
		}
		st = &sweepState{next: w.now() + int64(sweepEvery)}
		w.keys[key] = st
	}
	st.count = count
	if scanned {
		st.cursor = cursor
		st.next = w.now() + int64(sweepEvery)
	}
	if soon {
		st.next = 0
	}
}
