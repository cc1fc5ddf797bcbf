package quota

import (
	"context"
	"slices"
	"sync"
	"time"
)

// On one Redis server the compare-and-swaps of concurrent rounds share a script
// call (group commit, as the combiner's rounds share a key's load and swap).
// While fewer than maxSwapCalls calls are in flight, a Swap is sent at once, in a
// call of its own; when that many are, Swaps queue, and when a call ends, the
// first of them sends every queued op (up to maxBatchOps) in one EVALSHA. The
// server then runs one script call, not one per key: a round costs its HGET and
// HSET, and its share of the call. A Swap of maxBatchOps/2 ops or more (an Envoy's
// report of many keys) has little to share and is sent at once, whatever is in
// flight. Fixed windows start at the same instant for every key, so the first
// asks of a window's keys arrive together and share calls.
//
// Each op is still its own compare-and-swap: the script applies or refuses it by
// its own key's header, and an op on a key that is not a hash fails only its own
// Swap. A Swap whose context ends while it is queued leaves the queue unsent and
// returns the context's error; once sent, it waits for the call's answer.

// maxBatchOps bounds the ops of one script call: the server runs a script to its
// end before any other command, and a round's op takes it a few microseconds.
const maxBatchOps = 128

// maxSwapCalls bounds the script calls in flight at once: two, so that the
// server runs one call while the next crosses the network (one at a time would
// leave it idle for a round trip between calls).
const maxSwapCalls = 2

// swapBatch is the queue of Swaps waiting for a script call.
type swapBatch struct {
	mu sync.Mutex
	// calls in flight, or whose leader is about to send them; the queue is
	// empty while it is under maxSwapCalls.
	calls int
	queue []*swapCall // waiting to be sent, in arrival order
}

// swapCall is one Swap.
type swapCall struct {
	ctx  context.Context
	ops  []Op
	out  []bool
	err  error
	wake chan bool // true: send the next call; false: answered
	// Under swapBatch.mu: lead, told to send the next call; sent, taken
	// into a call.
	lead, sent bool
}

// swapRun runs one script call over ops: per op whether it was applied or its
// error, or one error for all (the call failed).
type swapRun func(ctx context.Context, ops []Op) ([]bool, []error, error)

// swap applies ops in a script call shared with the Swaps queued with them.
func (b *swapBatch) swap(ctx context.Context, ops []Op, run swapRun) ([]bool, error) {
	if len(ops) >= maxBatchOps/2 {
		// Too many to share a call with another Swap of its size: sent
		// at once, without waiting for the calls in flight.
		return answer(run(ctx, ops))
	}
	c := &swapCall{ctx: ctx, ops: ops, wake: make(chan bool, 1)}
	b.mu.Lock()
	if b.calls == maxSwapCalls {
		b.queue = append(b.queue, c)
		b.mu.Unlock()
		if !b.await(c) {
			return c.out, c.err
		}
	} else {
		b.calls++
		b.mu.Unlock()
	}
	b.send(c, run)
	return c.out, c.err
}

// await waits until c is answered (false) or told to send the next call
// (true: it was taken out of the queue to lead it). A context that ends while c
// is still queued takes it out of the queue.
func (b *swapBatch) await(c *swapCall) bool {
	select {
	case lead := <-c.wake:
		return lead
	case <-c.ctx.Done():
	}
	b.mu.Lock()
	if !c.lead && !c.sent {
		b.queue = slices.DeleteFunc(b.queue, func(q *swapCall) bool { return q == c })
		b.mu.Unlock()
		c.err = c.ctx.Err()
		return false
	}
	b.mu.Unlock()
	return <-c.wake
}

// send sends a script call of leader's ops and the queued Swaps', hands the next
// call to the first Swap still queued, and answers the others.
func (b *swapBatch) send(leader *swapCall, run swapRun) {
	b.mu.Lock()
	calls := []*swapCall{leader}
	size, n := len(leader.ops), 0
	for n < len(b.queue) && size+len(b.queue[n].ops) <= maxBatchOps {
		b.queue[n].sent = true
		size += len(b.queue[n].ops)
		n++
	}
	calls = append(calls, b.queue[:n]...)
	b.queue = slices.Delete(b.queue, 0, n)
	b.mu.Unlock()

	ops := make([]Op, 0, size)
	for _, c := range calls {
		ops = append(ops, c.ops...)
	}
	ctx, cancel := batchContext(calls)
	out, errs, err := run(ctx, ops)
	cancel()
	i := 0
	for _, c := range calls {
		k := len(c.ops)
		if err != nil {
			c.err = err
		} else {
			c.out, c.err = answer(out[i:i+k:i+k], errs[i:i+k], nil)
		}
		i += k
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.queue = slices.Delete(b.queue, 0, 1)
		next.lead = true
		next.wake <- true
	} else {
		b.calls--
	}
	b.mu.Unlock()
	for _, c := range calls {
		if c != leader {
			c.wake <- false
		}
	}
}

// answer is a Swap's answer from its ops' results: err, or the first op's error,
// or whether each was applied.
func answer(out []bool, errs []error, err error) ([]bool, error) {
	if err != nil {
		return nil, err
	}
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	return out, nil
}

// batchContext is the context of a call sending calls' ops: not cancelled with
// any one of them (the others wait for its answer), and with the latest of their
// deadlines when each has one.
func batchContext(calls []*swapCall) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(calls[0].ctx))
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), last)
}
