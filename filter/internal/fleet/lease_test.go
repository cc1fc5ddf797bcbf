package fleet

import "testing"

func TestPutFindAndEvict(t *testing.T) {
	var b []byte
	for h := uint64(1); h <= 3; h++ {
		b, _ = Put(nil, b, Entry{Hash: h, Held: h * 10, Expiry: 100, Fingerprint: 7}, 3, 0)
	}
	if len(b) != 3*EntrySize {
		t.Fatalf("len %d", len(b))
	}
	e, i, ok := Find(b, 2)
	if !ok || i != 1 || e.Held != 20 || !e.Usable(7, 50, 20) || e.Usable(8, 50, 1) || e.Usable(7, 100, 1) {
		t.Fatalf("find: %+v %d %v", e, i, ok)
	}
	b, ev := Put(nil, b, Entry{Hash: 2, Held: 5, Expiry: 100}, 3, 0)
	if ev || len(b) != 3*EntrySize {
		t.Fatalf("update evicted or grew")
	}
	if e, _, _ := Find(b, 2); e.Held != 5 {
		t.Fatalf("update lost: %+v", e)
	}
	// Full: evicts the entry holding the fewest units (hash 2, 5 units).
	b, ev = Put(nil, b, Entry{Hash: 9, Held: 1, Expiry: 100}, 3, 0)
	if !ev {
		t.Fatal("no eviction")
	}
	if _, _, ok := Find(b, 2); ok {
		t.Fatal("hash 2 should be evicted")
	}
	// An expired entry goes first.
	b, _ = Put(nil, b, Entry{Hash: 1, Held: 1000, Expiry: 10}, 3, 0)
	b, _ = Put(nil, b, Entry{Hash: 4, Held: 1, Expiry: 100}, 3, 50)
	if _, _, ok := Find(b, 1); ok {
		t.Fatal("expired hash 1 should be evicted")
	}
	if len(Entries(b)) != 3 {
		t.Fatalf("entries %d", len(Entries(b)))
	}
}

func TestCorruptBucketReadsEmpty(t *testing.T) {
	if _, _, ok := Find([]byte{1, 2, 3}, 0); ok {
		t.Fatal("found in a corrupt bucket")
	}
	b, _ := Put(nil, []byte{1, 2, 3}, Entry{Hash: 1, Held: 2}, 4, 0)
	if len(b) != EntrySize {
		t.Fatalf("len %d", len(b))
	}
	if Entries([]byte{1}) != nil {
		t.Fatal("entries of a corrupt bucket")
	}
}

// Every field survives the encoding, the charge and left ones included.
func TestAnEntryRoundTripsEveryField(t *testing.T) {
	e := Entry{Hash: 1, Held: 2, Used: 3, Expiry: 4, Sent: 5, Fingerprint: 6, LastUse: 7, Claim: 8, Charge: 9, ChargeUntil: 10,
		Reported: 11, Left: 12, LeftUntil: 13}
	b, _ := Put(nil, nil, e, 1, 0)
	if got, _, ok := Find(b, 1); !ok || got != e || len(b) != EntrySize {
		t.Fatalf("round trip: %+v (%d bytes), want %+v", got, len(b), e)
	}
}

// A charge adds up until a report takes it; one that lapsed is neither taken
// nor added to, and a new one starts then.
func TestAChargeIsTakenOnceUntilItLapses(t *testing.T) {
	var e Entry
	e.AddCharge(30, 100, 1000)
	e.AddCharge(20, 200, 5000) // the same charge: its end stays
	if e.Charge != 50 || e.ChargeUntil != 1000 {
		t.Fatalf("charged: %+v", e)
	}
	if units, until := e.TakeCharge(300); units != 50 || until != 1000 || e.Charge != 0 {
		t.Fatalf("taken: %d until %d, %+v", units, until, e)
	}
	if units, _ := e.TakeCharge(400); units != 0 {
		t.Fatalf("taken twice: %d", units)
	}
	e.AddCharge(50, 500, 1000) // a report not recorded gives it back
	e.AddCharge(5, 900, 2000)
	if units, _ := e.TakeCharge(1000); units != 0 {
		t.Fatalf("a lapsed charge was taken: %d", units)
	}
	e.AddCharge(5, 1000, 3000)
	e.AddCharge(5, 1500, 3000)
	if e.Charge != 10 || e.ChargeUntil != 3000 {
		t.Fatalf("a new charge after the lapse: %+v", e)
	}
}

// TestAnEntryOwingAChargeIsEvictedLast: a full bucket evicts an expired entry
// that holds nothing and owes nothing before one whose lease ended but whose
// charge (units admitted without a lease, not yet reported) is still due, and
// ranks the others by what they hold and owe together.
func TestAnEntryOwingAChargeIsEvictedLast(t *testing.T) {
	var b []byte
	b, _ = Put(nil, b, Entry{Hash: 1, Charge: 5, ChargeUntil: 1000}, 3, 0) // ended, owes 5
	b, _ = Put(nil, b, Entry{Hash: 2, Expiry: 10}, 3, 0)                   // ended, owes nothing
	b, _ = Put(nil, b, Entry{Hash: 3, Held: 3, Expiry: 1000}, 3, 0)
	b, _ = Put(nil, b, Entry{Hash: 4, Held: 1, Expiry: 1000}, 3, 50)
	if _, _, ok := Find(b, 2); ok {
		t.Fatal("the entry that holds and owes nothing was kept")
	}
	if _, _, ok := Find(b, 1); !ok {
		t.Fatal("the entry owing a charge was evicted")
	}
	b, _ = Put(nil, b, Entry{Hash: 5, Held: 1, Expiry: 1000}, 3, 50)
	if _, _, ok := Find(b, 4); ok {
		t.Fatal("want the entry holding 1 evicted before the one owing 5")
	}
	if _, _, ok := Find(b, 1); !ok {
		t.Fatal("the entry owing 5 was evicted before one holding 1")
	}
}
