package quota

import (
	"context"
	"strconv"
	"testing"
	"time"
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
