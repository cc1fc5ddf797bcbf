package registry

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestAFloodOfIdentitiesStaysBounded(t *testing.T) {
	r := New(Options{MaxEntries: 100})
	for i := range 1000 {
		r.Begin(Entry{Policy: "p", Node: "node-" + strconv.Itoa(i)})()
	}
	n, evicted := r.Len()
	if n != 100 || evicted != 900 {
		t.Fatalf("len %d evicted %d, want 100 and 900", n, evicted)
	}
	got := r.Policy("p")
	if len(got) != 100 || got[0].Node != "node-900" {
		t.Fatalf("kept %d entries from %q; want the 100 most recent", len(got), got[0].Node)
	}
}

func TestEntriesExpireButNotWhilePolling(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	r := New(Options{ExpireAfter: time.Minute, Now: c.now})
	r.Begin(Entry{Policy: "p", Node: "gone"})()
	end := r.Begin(Entry{Policy: "p", Node: "polling", Version: `"v3.e.s"`})
	c.add(2 * time.Minute)
	got := r.Policy("p")
	if len(got) != 1 || got[0].Node != "polling" || !got[0].Polling || got[0].Version != `"v3.e.s"` {
		t.Fatalf("got %+v, want only the polling entry", got)
	}
	end()
	if got := r.Policy("p"); len(got) != 1 || got[0].Polling || !got[0].LastSeen.Equal(c.now()) {
		t.Fatalf("after the poll ended: %+v", got)
	}
	c.add(2 * time.Minute)
	if got := r.Policy("p"); len(got) != 0 {
		t.Fatalf("expired entry kept: %+v", got)
	}
}

func TestFieldsAreClipped(t *testing.T) {
	r := New(Options{})
	r.Begin(Entry{Policy: "p", Node: strings.Repeat("x", 1000) + "\n", Build: "a\x00b"})()
	got := r.Policy("p")
	if len(got) != 1 || len(got[0].Node) != MaxFieldBytes || got[0].Build != "ab" {
		t.Fatalf("got %+v", got)
	}
	r.Begin(Entry{Policy: "p", Node: "\x01\x02"})()
	if n, _ := r.Len(); n != 1 {
		t.Fatalf("an empty node was recorded")
	}
}

func TestPoliciesAreSeparate(t *testing.T) {
	r := New(Options{})
	r.Begin(Entry{Policy: "a", Node: "n1"})()
	r.Begin(Entry{Policy: "b", Node: "n1"})()
	if len(r.Policy("a")) != 1 || len(r.Policy("b")) != 1 || len(r.All()) != 2 {
		t.Fatalf("a %v b %v", r.Policy("a"), r.Policy("b"))
	}
}
