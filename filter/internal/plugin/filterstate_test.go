package plugin

import (
	"strconv"
	"testing"
)

// TestUintMembersAreDecimal: appendUintMember writes what strconv writes,
// at every digit count, after what the buffer holds.
func TestUintMembersAreDecimal(t *testing.T) {
	for _, v := range []uint64{0, 1, 9, 10, 99, 100, 12345, 1e19, 1<<64 - 1} {
		got := string(appendUintMember([]byte(`{"a":1`), `,"n":`, v))
		if want := `{"a":1,"n":` + strconv.FormatUint(v, 10); got != want {
			t.Errorf("appendUintMember(%d) = %q, want %q", v, got, want)
		}
	}
}
