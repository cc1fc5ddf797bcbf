package rules

import (
	"reflect"
	"testing"
)

// TestKeySourcesNameWhatTheKeyReads: every alternative of every key part is
// counted, and a header read by several parts is named once.
func TestKeySourcesNameWhatTheKeyReads(t *testing.T) {
	p, err := ParsePolicy([]byte(`{"policy":"p","version":1,"identity":{"user_header":"x-user-id"},"rules":[
	 {"id":"a","key":["user|header:x-api-key","route","header:x-api-key|client_ip","method"],"algorithm":"fixed_window","limit":1,"window":"1s"},
	 {"id":"b","algorithm":"fixed_window","limit":1,"window":"1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(p, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := KeySources{ClientIP: true, User: true, Route: true, Method: true, Headers: []string{"x-api-key"}}
	if got := c.Rule(0).KeySources(); !reflect.DeepEqual(got, want) {
		t.Errorf("rule a: %+v, want %+v", got, want)
	}
	if got := c.Rule(1).KeySources(); !reflect.DeepEqual(got, KeySources{}) {
		t.Errorf("rule b (no key): %+v, want nothing", got)
	}
}
