package quota

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// swapManyFields: one swap sets, deletes and adds to more fields than the CAS
// script passes to one Redis command (it splits them), and a swap whose old
// header no longer matches changes nothing.
func swapManyFields(t *testing.T, b Backend) {
	ctx := context.Background()
	const key, n = "many-fields", 5000
	name := func(i int) string { return "e:" + strconv.Itoa(i) }
	var set []Field
	for i := range n {
		set = append(set, Field{Name: name(i), Value: []byte("v" + strconv.Itoa(i))})
	}
	swap := func(op Op) bool {
		t.Helper()
		ok, err := b.Swap(ctx, []Op{op})
		if err != nil {
			t.Fatalf("swap: %v", err)
		}
		return ok[0]
	}
	if !swap(Op{Key: key, New: []byte("h1"), Set: set, TTL: time.Minute}) {
		t.Fatal("the first swap of an absent key was not applied")
	}
	var del []string
	for i := 0; i < 1100; i++ {
		del = append(del, name(i))
	}
	add := []Delta{{Name: "c:1", By: 5}, {Name: "c:2", By: -1}}
	if swap(Op{Key: key, Old: []byte("h0"), New: []byte("hx"), Del: del, TTL: time.Minute}) {
		t.Fatal("a swap of a header that no longer matches was applied")
	}
	if !swap(Op{Key: key, Old: []byte("h1"), New: []byte("h2"), Set: []Field{{Name: name(4999), Value: []byte("new")}}, Del: del, Add: add, TTL: time.Minute}) {
		t.Fatal("the second swap was not applied")
	}
	fields := []string{name(0), name(1099), name(1100), name(1200), name(4999), "c:1", "c:2"}
	snap, err := b.Load(ctx, []Read{{Key: key, Fields: fields}})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	want := []string{"", "", "v1100", "v1200", "new", "5", ""}
	if string(snap[0].Header) != "h2" {
		t.Errorf("header %q, want h2", snap[0].Header)
	}
	for i, f := range fields {
		if got := string(snap[0].Fields[i]); got != want[i] {
			t.Errorf("%s = %q, want %q", f, got, want[i])
		}
	}
}

// concurrentSwaps: 32 writers swap at once, each 40 times, every Swap two ops:
// the writer's own key from its header to the next (applied every time) and a
// shared key from a header it never had (never applied); with a Redis client, a
// 33rd writer swaps a key that is not a hash, and only its own Swaps fail. At the
// end each key holds its last header and every increment exactly once.
func concurrentSwaps(t *testing.T, b Backend, client redis.UniversalClient) {
	ctx := context.Background()
	const writers, swaps = 32, 40
	key := func(w int) string { return "concurrent-" + strconv.Itoa(w) }
	hdr := func(n int) []byte {
		if n == 0 {
			return nil
		}
		return []byte("h" + strconv.Itoa(n))
	}
	if client != nil {
		if err := client.Set(ctx, "concurrent-string", "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range swaps {
				ok, err := b.Swap(ctx, []Op{
					{Key: key(w), Old: hdr(n), New: hdr(n + 1), Add: []Delta{{Name: "c", By: 1}}, TTL: time.Minute},
					{Key: "concurrent-shared", Old: []byte("never"), New: []byte("x"), TTL: time.Minute},
				})
				if err != nil || !ok[0] || ok[1] {
					t.Errorf("writer %d swap %d: %v %v, want [true false]", w, n, ok, err)
					return
				}
			}
		}()
	}
	if client != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range swaps {
				if _, err := b.Swap(ctx, []Op{{Key: "concurrent-string", New: []byte("x"), TTL: time.Minute}}); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Errorf("a swap of a key that is not a hash: %v, want WRONGTYPE", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for w := range writers {
		snap, err := b.Load(ctx, []Read{{Key: key(w), Fields: []string{"c"}}})
		if err != nil {
			t.Fatal(err)
		}
		if string(snap[0].Header) != string(hdr(swaps)) || string(snap[0].Fields[0]) != strconv.Itoa(swaps) {
			t.Errorf("%s: header %q, c %q; want %q, %d", key(w), snap[0].Header, snap[0].Fields[0], hdr(swaps), swaps)
		}
	}
}

// TestConcurrentSwapsOnOneServerShareScriptCalls: on one redis-server the Swaps
// of 32 concurrent writers (1,280 Swaps of two ops each) are sent in fewer than
// a quarter as many script calls as ops, each op still its own compare-and-swap
// (concurrentSwaps).
func TestConcurrentSwapsOnOneServerShareScriptCalls(t *testing.T) {
	rs := redisproc.Start(t)
	c := redisClient(rs.Addr())
	t.Cleanup(func() { c.Close() })
	before, err := redisproc.CommandCalls(rs.Addr())
	if err != nil {
		t.Fatal(err)
	}
	concurrentSwaps(t, NewRedis(c), c)
	after, err := redisproc.CommandCalls(rs.Addr())
	if err != nil {
		t.Fatal(err)
	}
	calls := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	ops := uint64(32*40*2 + 40)
	t.Logf("%d ops in %d script calls", ops, calls)
	if calls == 0 || calls*4 > ops {
		t.Errorf("%d ops in %d script calls, want fewer than a quarter", ops, calls)
	}
}

// TestASwapQueuedPastItsDeadlineIsNeverSent: while as many Swaps as may be in
// flight are, on a redis-server held busy for 450 ms (a script that loops; the
// quota client's read timeout is 500 ms), one more Swap, whose context ends
// after 50 ms, returns the context's error before they are answered, and its op
// is never applied; they are applied when the server answers, and the next
// Swap goes alone.
func TestASwapQueuedPastItsDeadlineIsNeverSent(t *testing.T) {
	rs := redisproc.Start(t)
	c := redisClient(rs.Addr())
	plain := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { c.Close(); plain.Close() })
	b := NewRedis(c)
	ctx := context.Background()

	busy := make(chan error, 1)
	go func() {
		busy <- plain.Eval(ctx, `local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  local n = redis.call('TIME')
  if tonumber(n[1]) * 1000000 + tonumber(n[2]) - start > 450000 then return 1 end
end`, nil).Err()
	}()
	probe := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { probe.Close() })
	for { // until the server is held by the script: a PING no longer answers
		select {
		case err := <-busy:
			t.Fatalf("the script holding the server ended before a PING went unanswered: %v", err)
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := probe.Ping(pctx).Err()
		cancel()
		if err != nil {
			break
		}
	}

	first := make(chan error, maxSwapCalls)
	for i := range maxSwapCalls {
		go func() {
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			ok, err := b.Swap(fctx, []Op{{Key: "first" + strconv.Itoa(i), New: []byte("h"), TTL: time.Minute}})
			if err == nil && !ok[0] {
				err = errors.New("not applied")
			}
			first <- err
		}()
	}
	for { // until every call the batch allows is in flight
		b.b.mu.Lock()
		full := b.b.calls == maxSwapCalls
		b.b.mu.Unlock()
		if full {
			break
		}
		runtime.Gosched()
	}
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := b.Swap(sctx, []Op{{Key: "second", New: []byte("h"), TTL: time.Minute}})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Swap queued past its deadline: %v, want context.DeadlineExceeded", err)
	}
	select {
	case err := <-first:
		t.Fatalf("the queued Swap returned only once a Swap in flight was answered (%v)", err)
	default:
	}
	for range maxSwapCalls {
		if err := <-first; err != nil {
			t.Fatalf("a Swap in flight: %v", err)
		}
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	if n, err := plain.Exists(ctx, "second").Result(); err != nil || n != 0 {
		t.Errorf("the op of the Swap that gave up: exists %d (%v), want never applied", n, err)
	}
	if ok, err := b.Swap(ctx, []Op{{Key: "third", New: []byte("h"), TTL: time.Minute}}); err != nil || !ok[0] {
		t.Errorf("a Swap after: %v %v", ok, err)
	}
}
