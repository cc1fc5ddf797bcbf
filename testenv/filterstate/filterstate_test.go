package filterstate

import (
	"maps"
	"testing"
)

func TestFromLogLine(t *testing.T) {
	got, err := FromLogLine(map[string]any{LogField: `{"rate_limited":true,"limit":3,"rule":"r","key":"k\u00e9"}`})
	want := map[string]string{"rate_limited": "true", "limit": "3", "rule": "r", "key": "ké"}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("FromLogLine = %v, %v; want %v", got, err, want)
	}
	if got, err := FromLogLine(map[string]any{LogField: nil}); err != nil || len(got) != 0 {
		t.Fatalf("null rate_limit = %v, %v; want empty", got, err)
	}
	for _, bad := range []any{float64(1), `{"rule":["r"]}`, `{"rule":null}`, `not json`} {
		if got, err := FromLogLine(map[string]any{LogField: bad}); err == nil {
			t.Errorf("FromLogLine(%#v) = %v, want an error", bad, got)
		}
	}
	if got := Fields(map[string]string{Key: `[1]`}); got["error"] == "" {
		t.Errorf("Fields of a non-object = %v, want an error entry", got)
	}
}
