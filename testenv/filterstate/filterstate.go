// Package filterstate reads the sluice filter's filter state in tests and
// tools: the one value the filter writes per request, which Envoy stores as
// wasm.sluice and the access log prints with
// %FILTER_STATE(wasm.sluice:PLAIN)%, a JSON object such as
//
//	{"rate_limited":false,"shadow":false,"policy_version":3,"rule":"per-user",
//	 "key":"rl:prod:api/per-user:user=alice:60s","limit":100,"remaining":99,"reset":60}
//
// (fields in docs/filter.md, "Filter: access-log metadata").
package filterstate

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Key is the filter-state key of the sluice filter's value, as Envoy (and
// testenv/host, in a stream's FilterState map) names it.
const Key = "wasm.sluice"

// LogField is the field of envoy/envoy.yaml's JSON access log that holds
// the value (%FILTER_STATE(wasm.sluice:PLAIN)%, a string; null when no rule
// applied to the request).
const LogField = "rate_limit"

// FromLogLine returns the fields of the value in one decoded JSON
// access-log line (see Fields for their form), or an empty map when the
// line has none. Errors: LogField is neither null nor a string, or Parse's.
func FromLogLine(line map[string]any) (map[string]string, error) {
	switch v := line[LogField].(type) {
	case nil:
		return map[string]string{}, nil
	case string:
		return Parse(v)
	default:
		return nil, &fieldError{field: LogField}
	}
}

// Fields returns the fields of the sluice value in fs (a stream's filter
// state: key → raw value) as strings: booleans "true" or "false", numbers
// in decimal, strings as they are. A field the value does not carry is
// absent from the map; without a value the map is empty. A value that is
// not a JSON object of strings, numbers and booleans gives a map whose one
// entry "error" says what is wrong, so that a test comparing fields fails
// and shows why.
func Fields(fs map[string]string) map[string]string {
	raw, ok := fs[Key]
	if !ok {
		return map[string]string{}
	}
	out, err := Parse(raw)
	if err != nil {
		return map[string]string{"error": err.Error() + ": " + raw}
	}
	return out
}

// Parse decodes one sluice value (see Fields). Errors: the value is not a
// JSON object, or a field is an object, an array or null.
func Parse(raw string) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out[k] = v
		case json.Number:
			out[k] = v.String()
		case bool:
			out[k] = strconv.FormatBool(v)
		default:
			return nil, &fieldError{field: k}
		}
	}
	return out, nil
}

// fieldError is Parse's error for a field that is not a string, number or
// boolean.
type fieldError struct{ field string }

// Error names the field.
func (e *fieldError) Error() string {
	return "filter state field " + strconv.Quote(e.field) + " is not a string, number or boolean"
}
