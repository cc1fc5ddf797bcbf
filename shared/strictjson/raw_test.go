package strictjson

import (
	"errors"
	"testing"
)

func TestRawReturnsMemberBytes(t *testing.T) {
	doc := []byte(` { "a" : 1 , "b\"}" : {"x":[1,{"y":"]}"}]} ,"c":"s","d":true, "e": null }`)
	want := map[string]string{"a": "1", `b"}`: `{"x":[1,{"y":"]}"}]}`, "c": `"s"`, "d": "true", "e": "null"}
	d := NewDecoder(doc, Limits{})
	got := map[string]string{}
	if err := d.Object(func(key string) error {
		raw, err := d.Raw()
		if err != nil {
			return err
		}
		if cap(raw) != len(raw) {
			t.Errorf("%s: cap %d > len %d: an append would write into the document", key, cap(raw), len(raw))
		}
		got[key] = string(raw)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("member %q = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d members, want %d", len(got), len(want))
	}
}

func TestRawErrors(t *testing.T) {
	for _, doc := range []string{"", "[", `{"a"`, `{"a":`, `{"a":{`, `tru`, `{"a":1,}`, `[[[[1]]]]`} {
		d := NewDecoder([]byte(doc), Limits{MaxDepth: 3})
		raw, err := d.Raw()
		if err == nil || raw != nil {
			t.Errorf("Raw(%q) = %q, %v; want nil and an error", doc, raw, err)
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(doc) {
			t.Errorf("Raw(%q): error %v has no offset inside the document", doc, err)
		}
		if again, err2 := d.Raw(); again != nil || err2 != err {
			t.Errorf("Raw(%q) after an error = %q, %v; want the same sticky error", doc, again, err2)
		}
	}
}
