package main

import (
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// saturationRules is one rule of each algorithm, keyed on the user, with its limit.
var saturationRules = []struct {
	name, rule string
	limit      int
}{
	{"token_bucket", `"algorithm":"token_bucket","limit":5,"window":"1h"`, 5},
	{"gcra", `"algorithm":"gcra","limit":5,"window":"1h","burst":4`, 5},
	{"fixed_window", `"algorithm":"fixed_window","limit":5,"window":"1h"`, 5},
	{"calendar_day", `"algorithm":"fixed_window","limit":5,"align":"calendar_day","timezone":"America/Havana"`, 5},
	{"time_wheel", `"algorithm":"time_wheel","limit":5,"window":"1h","slots":6`, 5},
	{"sliding_log", `"algorithm":"sliding_log","limit":5,"window":"1h"`, 5},
	{"concurrency", `"algorithm":"concurrency","limit":3,"lease":"1h"`, 3},
}

// userRequest sends one request of user through worker w and reports whether it was
// admitted; a concurrency request is left in flight (its stream never ends).
func (e *env) userRequest(w int, user string, inFlight bool) bool {
	e.t.Helper()
	if inFlight {
		_, st := e.openStream(w, "/", user)
		return st == host.Continue
	}
	r := e.do(w, req{path: "/", headers: host.Headers{{"x-user-id", user}}})
	return r.Status == 200
}

func saturationEnv(t *testing.T, rule string, buckets, entries int) *env {
	pol := `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[{"id":"r","key":["user"],` + rule + `}]}`
	return newEnv(t, `{"tick":"1m","buckets_per_rule":`+strconv.Itoa(buckets)+`,"entries_per_bucket":`+
		strconv.Itoa(entries)+`,"policy":`+pol+`}`, 2)
}

// TestAlternatingKeysStayLimitedThroughTheFilter: with the rule's only bucket full of
// live keys, two more users taking turns (on two workers) each stay within their limit,
// and the filter counts the decisions made against the bucket's overflow.
func TestAlternatingKeysStayLimitedThroughTheFilter(t *testing.T) {
	buildWasm(t)
	for _, tc := range saturationRules {
		t.Run(tc.name, func(t *testing.T) {
			e := saturationEnv(t, tc.rule, 1, 2)
			inFlight := tc.name == "concurrency"
			for _, u := range []string{"f1", "f2"} {
				if !e.userRequest(0, u, inFlight) {
					t.Fatalf("filler %s denied", u)
				}
			}
			admitted := map[string]int{}
			for i := 0; i < 3*tc.limit; i++ {
				for w, u := range []string{"a", "b"} {
					if e.userRequest(w, u, inFlight) {
						admitted[u]++
					}
				}
			}
			for u, n := range admitted {
				if n > tc.limit {
					t.Errorf("user %s admitted %d times, limit %d", u, n, tc.limit)
				}
			}
			if got := e.metric("sluice.rule.r.overflow"); got != int64(6*tc.limit) {
				t.Errorf("sluice.rule.r.overflow = %d, want %d", got, 6*tc.limit)
			}
			if got := e.metric("sluice.bucket_overflow"); got != int64(6*tc.limit) {
				t.Errorf("sluice.bucket_overflow = %d, want %d", got, 6*tc.limit)
			}
		})
	}
}

// TestFloodOfNewKeysKeepsKeyLimitedThroughTheFilter: a user at its limit stays limited
// while 20,000 distinct users pass through the same small table.
func TestFloodOfNewKeysKeepsKeyLimitedThroughTheFilter(t *testing.T) {
	buildWasm(t)
	n := 20_000
	if testing.Short() {
		n = 2_000
	}
	e := saturationEnv(t, `"algorithm":"fixed_window","limit":3,"window":"1h"`, 4, 4)
	for i := 0; i < 3; i++ {
		if !e.userRequest(0, "target", false) {
			t.Fatalf("target request %d denied", i)
		}
	}
	for i := 0; i < n; i++ {
		e.userRequest(i%2, "flood-"+strconv.Itoa(i), false)
		if i%500 == 499 && e.userRequest((i+1)%2, "target", false) {
			t.Fatalf("after %d new users the target at its limit was admitted", i+1)
		}
	}
}

// TestOverflowConcurrencyReleased: a concurrency slot taken in a full bucket's overflow
// is given back when its stream ends, so the next key without an entry gets it then,
// not only when the lease runs out.
func TestOverflowConcurrencyReleased(t *testing.T) {
	buildWasm(t)
	e := saturationEnv(t, `"algorithm":"concurrency","limit":1,"lease":"1h"`, 1, 1)
	if _, st := e.openStream(0, "/", "resident"); st != host.Continue {
		t.Fatal("resident user denied")
	}
	a, st := e.openStream(1, "/", "a")
	if st != host.Continue {
		t.Fatal("user a (overflow) denied")
	}
	if _, st := e.openStream(0, "/", "b"); st == host.Continue {
		t.Fatal("user b admitted while a holds the overflow's only slot")
	}
	e.finish(a, true)
	if _, st := e.openStream(0, "/", "b"); st != host.Continue {
		t.Fatal("user b denied after a's stream ended")
	}
}
