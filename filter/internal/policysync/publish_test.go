package policysync

import (
	"strconv"
	"strings"
	"testing"
)

// TestConcurrentPublishersNeverRollBackOrTear runs two publishers
// interleaved at every step: publisher A receives its policy, and before
// each of A's shared-data operations in turn, A stalls past its lease while
// B takes the lease, polls and publishes its own version completely; then
// A goes on. Whatever the step, the published version never goes down and
// the published document always reads whole.
func TestConcurrentPublishersNeverRollBackOrTear(t *testing.T) {
	for _, prior := range []int{0, 4} {
		for _, vv := range [][2]int{{5, 6}, {6, 5}} {
			va, vb := vv[0], vv[1]
			name := "prior " + strconv.Itoa(prior) + ", A v" + strconv.Itoa(va) + ", B v" + strconv.Itoa(vb)
			t.Run(name, func(t *testing.T) {
				for step := 1; ; step++ {
					if !interleavedPublish(t, step, prior, va, vb) {
						if step < 4 {
							t.Fatalf("A made only %d shared-data operations", step-1)
						}
						return
					}
				}
			})
		}
	}
}

// interleavedPublish runs one interleaving (B publishes before A's step-th
// shared-data operation) and checks the outcome; it returns false if A made
// fewer than step operations.
func interleavedPublish(t *testing.T, step, prior, va, vb int) bool {
	t.Helper()
	e := newEnv(t, 3, nil)
	var history []uint64 // every version the meta announced, in order
	e.st.watch = func(key string, val []byte) {
		if key == MetaKey("default") {
			if m, ok := DecodeMeta(val); ok {
				history = append(history, m.Version)
			}
		}
	}
	e.tick()
	a := e.holder()
	if prior > 0 {
		a.h.respond(a.h.lastCall(), "200", etag(prior), policyDoc(prior, prior))
		e.tick()
	}
	var b *worker
	for _, w := range e.ws {
		if w != a {
			b = w
			break
		}
	}
	ops, fired := 0, false
	a.h.onOp = func(op, key string) {
		ops++
		if ops != step || fired {
			return
		}
		fired = true
		// A stalls (compiling, preparing counters) past its lease: B takes
		// the lease, polls and publishes.
		e.clk.advance(2 * e.ws[0].s.o.Lease)
		b.s.Tick()
		if !b.s.Holding() {
			t.Fatalf("step %d: B did not take the lapsed lease", step)
		}
		b.h.respond(b.h.lastCall(), "200", etag(vb), policyDoc(vb, vb))
	}
	a.h.respond(a.h.lastCall(), "200", etag(va), policyDoc(va, va))
	a.h.onOp = nil
	if !fired {
		return false
	}
	for i := 1; i < len(history); i++ {
		if history[i] < history[i-1] {
			t.Fatalf("step %d: the published version went from %d back to %d (history %v)", step, history[i-1], history[i], history)
		}
	}
	val, _, err := e.st.get(MetaKey("default"))
	m, ok := DecodeMeta(val)
	if err != nil || !ok {
		t.Fatalf("step %d: no published meta (%v)", step, err)
	}
	// Only the published generation's chunks keep bytes: the replaced
	// one's and the loser's are shrunk.
	prefix := "sluice/policy/default/chunk/"
	own := prefix + strconv.FormatUint(m.Generation, 10) + "/"
	for key, ent := range e.st.entries {
		if strings.HasPrefix(key, prefix) && !strings.HasPrefix(key, own) && len(ent.val) != 0 {
			t.Fatalf("step %d: %s keeps %d bytes; generation %d is published", step, key, len(ent.val), m.Generation)
		}
	}
	// Every worker, and one started now, applies the published version:
	// its chunks read whole.
	late := e.add()
	e.tick()
	e.tick()
	for i, w := range append(e.ws, late) {
		if w.version() != m.Version {
			t.Fatalf("step %d: worker %d applied version %d, published %d (torn; history %v)", step, i, w.version(), m.Version, history)
		}
	}
	return true
}
