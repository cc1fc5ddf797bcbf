package table_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
	"github.com/sluice-proxy/sluice/shared/limit/table"
)

// A request matched by two rules is checked against both before it consumes from
// either: each rule's bucket is looked up and decided into a scratch state, and only
// if every rule allows are the new buckets written (in the filter, by CAS on each
// shared-data key, re-reading on conflict).
func Example() {
	var seed siphash.Key // the filter generates it once per Envoy and shares it
	copy(seed[:], "0123456789abcdef")
	const buckets = 8

	type rule struct {
		layout *table.Layout
		data   [buckets][]byte // stands in for the shared-data keys sluice/<policy>/<rule>/<n>
	}
	newRule := func(c limit.Config) *rule {
		l, err := limit.New(c)
		if err != nil {
			panic(err)
		}
		ly, err := table.New(l, 16)
		if err != nil {
			panic(err)
		}
		return &rule{layout: ly}
	}
	perUser := newRule(limit.Config{Algorithm: limit.SlidingLog, Limit: 2, Window: time.Minute})
	perTenant := newRule(limit.Config{Algorithm: limit.TokenBucket, Limit: 3, Window: time.Minute})

	request := func(user, tenant string, now int64) bool {
		rules := []*rule{perUser, perTenant}
		keys := []uint64{siphash.Sum64String(seed, user), siphash.Sum64String(seed, tenant)}
		var out [2][]byte
		for i, r := range rules {
			n := table.BucketOf(keys[i], buckets)
			s := r.layout.Lookup(r.data[n], keys[i], now)
			next := make([]byte, r.layout.Limiter().StateSize())
			if !r.layout.Limiter().Decide(s.State, next, now, 1).Allowed {
				return false // nothing consumed from any rule
			}
			out[i] = r.layout.Commit(make([]byte, r.layout.Size()), r.data[n], s, keys[i], next, now)
		}
		for i, r := range rules {
			r.data[table.BucketOf(keys[i], buckets)] = out[i]
		}
		return true
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	fmt.Println(request("alice", "acme", now)) // alice 1/2, acme 1/3
	fmt.Println(request("alice", "acme", now)) // alice 2/2, acme 2/3
	fmt.Println(request("alice", "acme", now)) // alice denied: acme not charged
	fmt.Println(request("bob", "acme", now))   // bob 1/2, acme 3/3
	fmt.Println(request("carol", "acme", now)) // acme denied
	// Output:
	// true
	// true
	// false
	// true
	// false
}
