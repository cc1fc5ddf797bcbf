package strictjson_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/shared/strictjson"
)

func ExampleDecoder() {
	doc := []byte(`{"name": "login", "limit": -1, "window": "5m", "tags": ["a", 2], "extra": true}`)
	var (
		name   string
		limit  uint64
		window time.Duration
		tags   []string
	)
	d := strictjson.NewDecoder(doc, strictjson.Limits{MaxBytes: 4096, MaxDepth: 4})
	_ = d.Object(func(key string) error {
		switch key {
		case "name":
			name, _ = d.String()
		case "limit":
			limit, _ = d.Uint64()
		case "window":
			window, _ = d.Duration()
		case "tags":
			return d.Array(func(int) error {
				s, _ := d.String()
				tags = append(tags, s)
				return nil
			})
		}
		return nil // a member the callback does not read is an unknown field
	})
	err := d.End()
	fmt.Println(name, limit, window, len(tags))
	for _, e := range d.Errors() {
		fmt.Println(e)
	}
	fmt.Println(err != nil)
	// Output:
	// login 0 5m0s 2
	// limit: must be a non-negative integer
	// tags[1]: must be a string
	// extra: unknown field
	// true
}

func ExampleWriter() {
	var w strictjson.Writer
	w.BeginObject()
	w.AppendKey("id")
	w.AppendString("a\"b")
	w.AppendKey("window")
	w.AppendDuration(90 * time.Second)
	w.AppendKey("methods")
	w.BeginArray()
	w.AppendString("GET")
	w.AppendString("POST")
	w.EndArray()
	w.EndObject()
	fmt.Println(string(w.Bytes()))
	// Output:
	// {"id":"a\"b","window":"1m30s","methods":["GET","POST"]}
}
