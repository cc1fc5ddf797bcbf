package quota

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRequestRoundTrip(t *testing.T) {
	r := &Request{Envoy: "ingress-0", Policy: "default", Version: 7, Env: "prod", Interval: 250 * time.Millisecond,
		Keys: []KeyRequest{{Rule: "r", Key: "rl:prod:default/r:*:60s", Used: 3, Return: 1, Want: 10}, {Rule: "r", Key: "k2"}}}
	doc := AppendRequest(nil, r)
	got, err := DecodeRequest(doc, Limits{})
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("got %+v, want %+v", got, r)
	}
	if again := AppendRequest(nil, got); string(again) != string(doc) {
		t.Fatalf("not canonical: %s vs %s", again, doc)
	}
}

func TestRequestDefaults(t *testing.T) {
	got, err := DecodeRequest([]byte(`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k"}]}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Env != "default" || got.Interval != DefaultInterval {
		t.Fatalf("defaults: %+v", got)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	r := &Response{Policy: "p", Version: 3, Now: 1763890000000000000, Keys: []KeyResult{
		{Key: "k", Status: StatusPartial, Granted: 4, Held: 9, Returned: 2, ExpiresIn: time.Second, RetryAfter: time.Millisecond},
		{Key: "k2", Status: StatusRefused, RetryAfter: time.Duration(1<<63 - 1)},
		{Key: "k3", Status: StatusGranted, Granted: 1, Held: 1, ExpiresIn: time.Second, Envoys: 7},
		{Key: "k4", Status: StatusGranted, Envoys: 3, Left: 0, LeftFor: 9 * time.Second},
		{Key: "k5", Status: StatusRefused, Envoys: 3, Left: 41, LeftFor: time.Nanosecond},
	}}
	got, err := DecodeResponse(AppendResponse(nil, r))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("got %+v, want %+v", got, r)
	}
}

func TestMalformedRequestsNameTheField(t *testing.T) {
	cases := []struct{ doc, field, msg string }{
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k","want":-1}]}`, "keys[0].want", ""},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k","wnat":1}]}`, "keys[0].wnat", "unknown field"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"key":"k"}]}`, "keys[0].rule", "required"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r"}]}`, "keys[0].key", "required"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k"},{"rule":"r","key":"k"}]}`, "keys[1].key", "duplicate"},
		{`{"envoy":"e","policy":"p","version":0,"keys":[{"rule":"r","key":"k"}]}`, "version", ">= 1"},
		{`{"envoy":"a b","policy":"p","version":1,"keys":[{"rule":"r","key":"k"}]}`, "envoy", "printable"},
		{`{"policy":"p","version":1,"keys":[{"rule":"r","key":"k"}]}`, "envoy", "required"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[]}`, "keys", "at least one"},
		{`{"envoy":"e","policy":"p","version":1,"interval":"1h","keys":[{"rule":"r","key":"k"}]}`, "interval", "between"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k","want":1099511627777}]}`, "keys[0].want", "<="},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k"}]`, "keys", "end of input"},
		{`{"envoy":"e","envoy":"f","policy":"p","version":1,"keys":[{"rule":"r","key":"k"}]}`, "envoy", "duplicate"},
	}
	for _, c := range cases {
		_, err := DecodeRequest([]byte(c.doc), Limits{})
		var errs Errors
		if !errors.As(err, &errs) || len(errs) == 0 {
			t.Fatalf("%s: err %v, want Errors", c.doc, err)
		}
		if errs[0].Field != c.field || !strings.Contains(errs[0].Message, c.msg) {
			t.Errorf("%s: got %v, want %s: ...%s...", c.doc, errs, c.field, c.msg)
		}
	}
}

func TestOversizedRequestsAreTooLarge(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"envoy":"e","policy":"p","version":1,"keys":[`)
	for i := 0; i < 11; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"rule":"r","key":"k` + strconv.Itoa(i) + `"}`)
	}
	b.WriteString(`]}`)
	_, err := DecodeRequest([]byte(b.String()), Limits{MaxKeys: 10})
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Field != "keys" || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many keys: %v", err)
	}
	_, err = DecodeRequest([]byte(b.String()), Limits{MaxBytes: 100})
	if !errors.As(err, &tl) || tl.Field != "" {
		t.Fatalf("too many bytes: %v", err)
	}
	if _, err := DecodeRequest([]byte(b.String()), Limits{MaxKeys: 11}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"r","key":"k","used":1,"return":2,"want":3}]}`))
	f.Add([]byte(`{"keys":[1,2,{}]}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		r, err := DecodeRequest(doc, Limits{MaxKeys: 50})
		if err != nil {
			return
		}
		again, err := DecodeRequest(AppendRequest(nil, r), Limits{MaxKeys: 50})
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip: %v %+v %+v", err, again, r)
		}
	})
}
