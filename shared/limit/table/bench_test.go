package table

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
)

// BenchmarkFullTable measures one request's work on its bucket in a full table of 16
// live token_bucket entries: Lookup + Decide + Commit into a caller buffer. "found" is
// a key at the last entry (a whole scan); "overflow" is a new key decided against the
// overflow state.
func BenchmarkFullTable(b *testing.B) {
	for _, entries := range []int{16, 64} {
		ly := newLayout(b, limit.Config{Algorithm: limit.TokenBucket, Limit: 100, Window: time.Second}, entries)
		var bucket []byte
		for i := 1; i <= entries; i++ {
			bucket, _, _ = hit(b, ly, bucket, uint64(i)*0x9e3779b97f4a7c15, t0)
		}
		dst := make([]byte, ly.Size())
		next := make([]byte, ly.Limiter().StateSize())
		for _, tc := range []struct {
			name string
			key  uint64
		}{{"found", uint64(entries) * 0x9e3779b97f4a7c15}, {"overflow", 12345}} {
			b.Run(tc.name+"/"+strconv.Itoa(entries), func(b *testing.B) {
				if s := ly.Lookup(bucket, tc.key, t0); s.Found != (tc.name == "found") || s.Overflow == (tc.name == "found") {
					b.Fatalf("setup: %+v", s)
				}
				b.ReportAllocs()
				for b.Loop() {
					s := ly.Lookup(bucket, tc.key, t0)
					if ly.Limiter().Decide(s.State, next, t0, 1).Allowed {
						ly.Commit(dst, bucket, s, tc.key, next, t0)
					}
				}
			})
		}
	}
}
