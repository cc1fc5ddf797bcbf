package limit_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// Five requests per 15 seconds per key, as a token bucket: the sixth is denied and
// told to come back when one token has refilled.
func Example() {
	l, err := limit.New(limit.Config{Algorithm: limit.TokenBucket, Limit: 5, Window: 15 * time.Second})
	if err != nil {
		panic(err)
	}
	state := make([]byte, l.StateSize()) // all zero: a fresh key
	next := make([]byte, l.StateSize())
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := 1; i <= 6; i++ {
		d := l.Decide(state, next, now, 1)
		fmt.Printf("request %d: allowed=%v remaining=%d reset=%v retry_after=%v\n", i, d.Allowed, d.Remaining, d.Reset, d.RetryAfter)
		if d.Allowed {
			state, next = next, state // commit (the filter does this with a CAS)
		}
	}
	// Output:
	// request 1: allowed=true remaining=4 reset=3s retry_after=0s
	// request 2: allowed=true remaining=3 reset=6s retry_after=0s
	// request 3: allowed=true remaining=2 reset=9s retry_after=0s
	// request 4: allowed=true remaining=1 reset=12s retry_after=0s
	// request 5: allowed=true remaining=0 reset=15s retry_after=0s
	// request 6: allowed=false remaining=0 reset=15s retry_after=3s
}

// Validate names the bad parameter by its JSON name.
func ExampleConfig_Validate() {
	err := limit.Config{Algorithm: limit.TimeWheel, Limit: 100, Window: 10 * time.Second, Slots: 100}.Validate()
	fmt.Println(err)
	// Output: slots: must be <= 60, got 100
}
