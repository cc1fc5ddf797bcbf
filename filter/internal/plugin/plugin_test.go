package plugin

import (
	"net/netip"
	"testing"
	"time"
)

func TestXFFHop(t *testing.T) {
	for _, tc := range []struct {
		xff  string
		n    int
		want string
	}{
		{"203.0.113.7", 1, "203.0.113.7"},
		{"1.1.1.1, 203.0.113.7", 1, "203.0.113.7"},
		{"1.1.1.1, 203.0.113.7", 2, "1.1.1.1"},
		{"spoof, 1.1.1.1,203.0.113.7 , 10.0.0.1", 2, "203.0.113.7"},
		{"[2001:db8::1]:443, 10.0.0.1", 2, "2001:db8::1"},
		{"192.0.2.1:8080", 1, "192.0.2.1"},
		{"::ffff:192.0.2.1", 1, "192.0.2.1"},
	} {
		got, ok := xffHop(tc.xff, tc.n)
		if !ok || got != netip.MustParseAddr(tc.want) {
			t.Errorf("xffHop(%q, %d) = %v, %v; want %s", tc.xff, tc.n, got, ok, tc.want)
		}
	}
	for _, tc := range []struct {
		xff string
		n   int
	}{
		{"", 1}, {"1.1.1.1", 2}, {"1.1.1.1, junk", 1}, {"1.1.1.1,", 1}, {"a,b,c", 3},
	} {
		if got, ok := xffHop(tc.xff, tc.n); ok {
			t.Errorf("xffHop(%q, %d) = %v, want none", tc.xff, tc.n, got)
		}
	}
}

func TestTraceparentID(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	good := "00-" + id + "-00f067aa0ba902b7-01"
	if got, ok := traceparentID(good); !ok || got != id {
		t.Fatalf("traceparentID(%q) = %q, %v", good, got, ok)
	}
	if got, ok := traceparentID("01-" + id + "-00f067aa0ba902b7-01-future"); !ok || got != id {
		t.Fatalf("future version: %q, %v", got, ok)
	}
	for _, bad := range []string{
		"", "00-" + id + "-00f067aa0ba902b7-0", "ff-" + id + "-00f067aa0ba902b7-01",
		"00-" + "4BF92F3577B34DA6A3CE929D0E0E4736" + "-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-" + id + "-0000000000000000-01",
		good + "-extra", "00_" + id + "-00f067aa0ba902b7-01",
	} {
		if got, ok := traceparentID(bad); ok {
			t.Errorf("traceparentID(%q) = %q, want invalid", bad, got)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]uint64{
		0: 0, -time.Second: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 14500 * time.Millisecond: 15,
	} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
