package api_test

import (
	"strings"
	"testing"
)

// TestMalformedBodyIsLocated: a body that is not well-formed JSON, or holds a value
// of the wrong type, is a 400 whose detail gives the byte offset, line and column;
// a negative limit reads "must be > 0", as a zero one does.
func TestMalformedBodyIsLocated(t *testing.T) {
	r := startReplica(t, boltBackend(t))
	type detail struct {
		Field, Message string
		Offset         *int
		Line, Column   int
	}
	var out struct {
		Error struct{ Details []detail }
	}
	bad := r.admin.Do("PUT", "/v1/policies/x", []byte("{\"policy\":\"x\",\n\"rules\":[\n{\"id\":\"a\",\n\"limit\":5,,\n}]}"))
	bad.JSON(t, &out)
	if bad.Status != 400 || len(out.Error.Details) != 1 || out.Error.Details[0].Offset == nil ||
		out.Error.Details[0].Line != 4 || out.Error.Details[0].Column != 11 {
		t.Fatalf("malformed body: %d %s", bad.Status, bad.Body)
	}
	neg := r.admin.Do("PUT", "/v1/policies/x", []byte(`{"policy":"x","rules":[{"id":"a","algorithm":"gcra","limit":-5,"window":"1s"}]}`))
	if neg.Status != 400 || !strings.Contains(string(neg.Body), `"message":"must be > 0"`) {
		t.Fatalf("negative limit: %d %s", neg.Status, neg.Body)
	}
}
