package table

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
)

const t0 = int64(1_700_000_100) * int64(time.Second)

func newLayout(t testing.TB, c limit.Config, entries int) *Layout {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ly, err := New(l, entries)
	if err != nil {
		t.Fatal(err)
	}
	return ly
}

// hit runs one request of key through bucket b and returns the new bucket (committed
// only if allowed), the slot and the decision.
func hit(t testing.TB, ly *Layout, b []byte, key uint64, now int64) ([]byte, Slot, limit.Decision) {
	t.Helper()
	s := ly.Lookup(b, key, now)
	next := make([]byte, ly.Limiter().StateSize())
	d := ly.Limiter().Decide(s.State, next, now, 1)
	if !d.Allowed {
		return b, s, d
	}
	return ly.Commit(make([]byte, ly.Size()), b, s, key, next, now), s, d
}

var tb5 = limit.Config{Algorithm: limit.TokenBucket, Limit: 5, Window: 15 * time.Second}

func TestLayoutSizeAndHeader(t *testing.T) {
	ly := newLayout(t, tb5, 4)
	if ly.Size() != 16+5*(16+16) || ly.Entries() != 4 {
		t.Fatalf("Size = %d", ly.Size())
	}
	b, s, _ := hit(t, ly, nil, 42, t0)
	if s.Status != Empty || s.Found || s.Index != 0 {
		t.Fatalf("first slot %+v", s)
	}
	if b[0] != 's' || b[1] != FormatVersion || b[2] != byte(limit.TokenBucket) {
		t.Fatalf("header % x", b[:16])
	}
	k, idle, st, ok := ly.Entry(b, 0)
	if !ok || k != 42 || idle != t0+int64(3*time.Second) || len(st) != 16 {
		t.Fatalf("entry 0: %d %d %v %v", k, idle, st, ok)
	}
	if s := ly.Lookup(b, 42, t0); s.Status != OK || !s.Found || s.Index != 0 {
		t.Fatalf("second lookup %+v", s)
	}
}

func TestNewErrors(t *testing.T) {
	l, _ := limit.New(limit.Config{Algorithm: limit.SlidingLog, Limit: 64, Window: time.Second})
	small, _ := limit.New(tb5)
	tests := []struct {
		l       limit.Limiter
		entries int
		want    string
	}{
		{small, 0, "table: entries must be 1..64, got 0"},
		{small, 65, "table: entries must be 1..64, got 65"},
		{nil, 1, "table: nil limiter"},
		{l, 64, "table: bucket of 64 entries of 520-byte state is 34856 bytes, more than 32768"},
		{l, 61, "table: bucket of 61 entries of 520-byte state is 33248 bytes, more than 32768"},
	}
	for _, tt := range tests {
		_, err := New(tt.l, tt.entries)
		if err == nil || err.Error() != tt.want || !errors.Is(err, ErrLayout) {
			t.Errorf("New(%d) = %v, want %q", tt.entries, err, tt.want)
		}
	}
}

// TestKeysAreIndependent: two keys in one bucket are limited separately and exactly.
func TestKeysAreIndependent(t *testing.T) {
	ly := newLayout(t, tb5, 4)
	var b []byte
	for i := 0; i < 5; i++ {
		var d limit.Decision
		b, _, d = hit(t, ly, b, 1, t0)
		if !d.Allowed {
			t.Fatalf("key 1 request %d denied", i)
		}
	}
	if _, _, d := hit(t, ly, b, 1, t0); d.Allowed || d.RetryAfter != 3*time.Second {
		t.Fatalf("key 1 6th: %+v", d)
	}
	if _, s, d := hit(t, ly, b, 2, t0); !d.Allowed || s.Index != 1 || s.Found {
		t.Fatalf("key 2: %+v %+v", s, d)
	}
}

func TestIdleEntryReused(t *testing.T) {
	ly := newLayout(t, tb5, 2)
	var b []byte
	b, _, _ = hit(t, ly, b, 1, t0)                       // idle at t0+3s
	b, _, _ = hit(t, ly, b, 2, t0+int64(time.Second))    // idle at t0+4s
	_, s, _ := hit(t, ly, b, 3, t0+int64(2*time.Second)) // both live: the overflow
	if !s.Overflow || s.Index != 2 || s.Found || s.State != nil {
		t.Fatalf("at 2s: %+v, want the (idle) overflow", s)
	}
	b2, s, _ := hit(t, ly, b, 3, t0+int64(3500*time.Millisecond)) // key 1 idle since 3s
	if s.Overflow || s.Index != 0 || s.Found {
		t.Fatalf("at 3.5s: %+v, want reuse of idle entry 0", s)
	}
	if s := ly.Lookup(b2, 1, t0+int64(3500*time.Millisecond)); s.Found {
		t.Fatal("key 1 still present after reuse")
	}
	// A key whose own entry is idle finds it (and its fresh-equivalent state).
	if s := ly.Lookup(b2, 2, t0+int64(time.Hour)); !s.Found || s.Index != 1 || !ly.Limiter().Idle(s.State, t0+int64(time.Hour)) {
		t.Fatalf("key 2 later: %+v", s)
	}
}

// TestFullBucketUsesOverflow: with every entry live, no entry changes hands: the most
// restricted key survives key rotation, the rotating keys share the overflow's limit,
// and a key that then finds an idle entry starts it from the overflow state.
func TestFullBucketUsesOverflow(t *testing.T) {
	ly := newLayout(t, tb5, 3)
	var b []byte
	// key 100 is heavily limited: bucket empty, idle in 15s.
	for i := 0; i < 5; i++ {
		b, _, _ = hit(t, ly, b, 100, t0)
	}
	b, _, _ = hit(t, ly, b, 1, t0) // idle at 3s
	b, _, _ = hit(t, ly, b, 2, t0) // idle at 3s
	admitted := 0
	for k := uint64(3); k < 50; k++ { // a client rotating keys
		var s Slot
		var d limit.Decision
		b, s, d = hit(t, ly, b, k, t0+int64(k)*int64(time.Millisecond))
		if !s.Overflow || s.Index != 3 {
			t.Fatalf("key %d: %+v, want the overflow", k, s)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("rotating keys admitted %d times, want 5 (the overflow's capacity)", admitted)
	}
	if _, _, d := hit(t, ly, b, 100, t0+int64(time.Second)); d.Allowed {
		t.Fatal("restricted key 100 was forgotten")
	}
	for i := 0; i < 3; i++ {
		if k, _, _, _ := ly.Entry(b, i); k != []uint64{100, 1, 2}[i] {
			t.Fatalf("entry %d holds key %d", i, k)
		}
	}
	// At 3.5s keys 1 and 2 are idle; the overflow (5 taken at 3..7ms, refilled one per
	// 3s) holds one token. Key 60 takes entry 1 from the overflow state: one admitted.
	at := t0 + int64(3500*time.Millisecond)
	s := ly.Lookup(b, 60, at)
	if s.Overflow || s.Found || s.Index != 1 || s.State == nil {
		t.Fatalf("key 60 at 3.5s: %+v, want idle entry 1 starting from the overflow", s)
	}
	b, _, d := hit(t, ly, b, 60, at)
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("key 60 first: %+v, want allowed with 0 remaining", d)
	}
	if _, _, d := hit(t, ly, b, 60, at); d.Allowed {
		t.Fatalf("key 60 second: %+v, want denied", d)
	}
}

// TestCurrentFindsWhereChargesAre: corrections go to the key's entry, else to the
// overflow; a malformed bucket has nothing to correct.
func TestCurrentFindsWhereChargesAre(t *testing.T) {
	ly := newLayout(t, tb5, 1)
	b, _, _ := hit(t, ly, nil, 1, t0)
	if s := ly.Current(b, 1); !s.Found || s.Index != 0 || s.Overflow {
		t.Fatalf("resident: %+v", s)
	}
	if s := ly.Current(b, 2); s.Found || !s.Overflow || s.Index != 1 || len(s.State) != 16 {
		t.Fatalf("not resident: %+v", s)
	}
	if s := ly.Current(nil, 2); s.Found || s.Overflow || s.Status != Empty {
		t.Fatalf("empty: %+v", s)
	}
	// Charging key 2 through Current lands in the overflow, and key 2 then sees it.
	s := ly.Current(b, 2)
	next := make([]byte, 16)
	ly.Limiter().Adjust(s.State, next, t0, 5)
	b = ly.Commit(make([]byte, ly.Size()), b, s, 2, next, t0)
	if _, _, d := hit(t, ly, b, 2, t0); d.Allowed {
		t.Fatalf("key 2 after a charge of 5 in the overflow: %+v, want denied", d)
	}
	if _, _, d := hit(t, ly, b, 1, t0); !d.Allowed {
		t.Fatalf("key 1: %+v, want allowed", d)
	}
}

func TestMalformedBuckets(t *testing.T) {
	ly := newLayout(t, tb5, 2)
	good, _, _ := hit(t, ly, nil, 1, t0)
	other := newLayout(t, limit.Config{Algorithm: limit.TokenBucket, Limit: 6, Window: 15 * time.Second}, 2)
	otherB, _, _ := hit(t, other, nil, 1, t0)
	bigger := newLayout(t, tb5, 3)
	biggerB, _, _ := hit(t, bigger, nil, 1, t0)
	mut := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want Status
	}{
		{"nil", nil, Empty},
		{"good", good, OK},
		{"truncated", good[:len(good)-1], Corrupt},
		{"longer", append(append([]byte(nil), good...), 0), Corrupt},
		{"header only", good[:16], Corrupt},
		{"short", []byte{'s', 1}, Corrupt},
		{"json from another plugin", []byte(`{"hello":"world"}`), Corrupt},
		{"no magic", mut(func(b []byte) { b[0] = 'x' }), Corrupt},
		{"reserved byte", mut(func(b []byte) { b[11] = 1 }), Corrupt},
		{"huge state size", mut(func(b []byte) { b[15] = 0xff }), Corrupt},
		{"old version", mut(func(b []byte) { b[1] = 0 }), Stale},
		{"other algorithm", mut(func(b []byte) { b[2] = byte(limit.GCRA) }), Stale},
		{"changed definition", otherB, Stale},
		{"changed entry count", biggerB, Stale},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ly.Lookup(tt.b, 1, t0)
			if s.Status != tt.want {
				t.Fatalf("Status = %v, want %v", s.Status, tt.want)
			}
			if tt.want != OK && (s.Found || s.State != nil || s.Index != 0 || s.Overflow) {
				t.Fatalf("malformed bucket not read as empty: %+v", s)
			}
			// Committing rewrites a whole, well-formed bucket.
			next := make([]byte, 16)
			ly.Limiter().Decide(s.State, next, t0, 1)
			out := ly.Commit(make([]byte, ly.Size()), tt.b, s, 1, next, t0)
			if ly.Lookup(out, 1, t0).Status != OK {
				t.Fatal("commit did not produce an OK bucket")
			}
		})
	}
}

// TestCommitInPlace: dst may be the bucket itself.
func TestCommitInPlace(t *testing.T) {
	ly := newLayout(t, tb5, 2)
	b, _, _ := hit(t, ly, nil, 1, t0)
	s := ly.Lookup(b, 2, t0)
	next := make([]byte, 16)
	ly.Limiter().Decide(s.State, next, t0, 1)
	b2 := ly.Commit(b, b, s, 2, next, t0)
	if &b2[0] != &b[0] || !ly.Lookup(b2, 1, t0).Found || !ly.Lookup(b2, 2, t0).Found {
		t.Fatal("in-place commit lost an entry")
	}
	// Hash 0 marks a never-used entry, so a key hashing to 0 is stored as 1.
	if got := ly.Lookup(b2, 0, t0); !got.Found || got.Index != 0 {
		t.Fatalf("key hash 0 is not stored as 1: %+v", got)
	}
}

// TestDistribution: siphash keys spread evenly over buckets (chi-square, 64 buckets,
// 64000 keys; the 99.9% quantile for 63 degrees of freedom is 103.4).
func TestDistribution(t *testing.T) {
	var k siphash.Key
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range k {
		k[i] = byte(rng.Uint32())
	}
	const buckets, keys = 64, 64000
	var counts [buckets]int
	for i := 0; i < keys; i++ {
		counts[BucketOf(siphash.Sum64String(k, "203.0.113."+strconv.Itoa(i)), buckets)]++
	}
	exp := float64(keys) / buckets
	chi := 0.0
	for _, c := range counts {
		chi += (float64(c) - exp) * (float64(c) - exp) / exp
	}
	if chi > 103.4 {
		t.Errorf("chi-square = %.1f over %d buckets: %v", chi, buckets, counts)
	}
	if BucketOf(math.MaxUint64, 7) != 6 || BucketOf(0, 7) != 0 || BucketOf(5, 0) != 0 {
		t.Error("BucketOf range")
	}
}

func TestNoAllocs(t *testing.T) {
	ly := newLayout(t, tb5, 16)
	b := make([]byte, ly.Size())
	dst := make([]byte, ly.Size())
	next := make([]byte, 16)
	for i := 0; i < 16; i++ {
		s := ly.Lookup(b, uint64(i+1), t0)
		ly.Limiter().Decide(s.State, next, t0, 1)
		b = ly.Commit(make([]byte, ly.Size()), b, s, uint64(i+1), next, t0)
	}
	n := testing.AllocsPerRun(100, func() {
		s := ly.Lookup(b, 99, t0)
		ly.Limiter().Decide(s.State, next, t0, 1)
		ly.Commit(dst, b, s, 99, next, t0)
	})
	if n != 0 {
		t.Errorf("allocs = %v", n)
	}
}

func TestStatusString(t *testing.T) {
	if OK.String() != "ok" || Corrupt.String() != "corrupt" || Status(9).String() != "status(9)" {
		t.Error("Status.String")
	}
}
