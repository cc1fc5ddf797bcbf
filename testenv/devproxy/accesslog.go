package devproxy

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// LogEntry is what one finished stream gives the access log: the values
// Envoy's command operators read from StreamInfo and the header maps.
type LogEntry struct {
	// Start is when the request's first byte arrived (%START_TIME%).
	Start time.Time
	// Duration is from Start to the last byte sent (%DURATION%).
	Duration time.Duration
	// RequestHeaders are the request headers as the filter left them,
	// pseudo-headers included (%REQ(...)%).
	RequestHeaders host.Headers
	// ResponseHeaders are the response headers sent downstream (%RESP(...)%).
	ResponseHeaders host.Headers
	// ResponseCode is the status sent downstream; 0 means none was (the
	// client went away first), as in Envoy.
	ResponseCode int
	// Details is %RESPONSE_CODE_DETAILS% ("via_upstream", a local reply's
	// details, "upstream_reset_before_response_started{connection_failure}" …).
	Details string
	// Flags is %RESPONSE_FLAGS%, e.g. "UF", "DC"; "" means none ("-").
	Flags string
	// Protocol is %PROTOCOL%, e.g. "HTTP/1.1".
	Protocol string
	// Remote and Local are the downstream connection's "ip:port".
	Remote, Local string
	// UpstreamHost and UpstreamCluster are %UPSTREAM_HOST% ("ip:port") and
	// %UPSTREAM_CLUSTER%; "" when the request never went upstream.
	UpstreamHost, UpstreamCluster string
	// FilterState is the stream's filter state, "wasm.<key>" → raw bytes.
	FilterState map[string]string
	// BytesReceived and BytesSent are body bytes (%BYTES_RECEIVED%,
	// %BYTES_SENT%).
	BytesReceived, BytesSent int64
}

// Format is a compiled log_format.json_format: it renders one LogEntry as
// one JSON object, typed as Envoy's SubstitutionFormatString.json_format
// is ("Values are rendered as strings, numbers, or boolean values as
// appropriate", api/envoy/config/core/v3/substitution_format_string.proto).
// Following Envoy's access-log docs (configuration/observability/
// access_log/usage.rst, "Command Operators"): a value that is a single
// command operator is typed, and null when the operator has no value; in a
// value that mixes text and operators, an operator without a value renders
// as "-" and the whole value is a string. Keys are written sorted (a JSON
// object's order carries no meaning; Envoy's own order is not documented).
type Format struct {
	root *object
	env  func(string) (string, bool)
}

type object struct {
	keys []string
	vals []any // *object or *value
}

type value struct {
	text  string // a constant (no operator)
	parts []part
	typed bool // exactly one operator and no text
}

type part struct {
	lit string
	op  *operator // nil: lit
}

type operator struct {
	name   string
	arg    string // inside (...), alternatives after '?'
	alt    string
	maxLen int // the :Z suffix; 0 none
	plain  bool
}

// CompileFormat compiles a json_format dictionary. formatters names the
// declared formatter extensions: %REQ_WITHOUT_QUERY(...)% needs
// envoy.formatter.req_without_query and %CEL(...)% envoy.formatter.cel,
// as in Envoy.
//
// # Errors
//
// An operator the dev proxy does not implement, or implements only in
// part (e.g. %FILTER_STATE% without :PLAIN, a %CEL% expression other than
// an attribute it knows), is refused with a message naming it, rather
// than logged wrongly.
func CompileFormat(s *structpb.Struct, formatters []string) (*Format, error) {
	f := &Format{env: os.LookupEnv}
	root, err := compileObject(s, formatters, "")
	if err != nil {
		return nil, err
	}
	f.root = root
	return f, nil
}

func compileObject(s *structpb.Struct, formatters []string, path string) (*object, error) {
	o := &object{}
	for k := range s.GetFields() {
		o.keys = append(o.keys, k)
	}
	sort.Strings(o.keys)
	for _, k := range o.keys {
		v := s.GetFields()[k]
		switch x := v.GetKind().(type) {
		case *structpb.Value_StructValue:
			sub, err := compileObject(x.StructValue, formatters, path+k+".")
			if err != nil {
				return nil, err
			}
			o.vals = append(o.vals, sub)
		case *structpb.Value_StringValue:
			cv, err := compileValue(x.StringValue, formatters)
			if err != nil {
				return nil, fmt.Errorf("json_format %s%s: %w", path, k, err)
			}
			o.vals = append(o.vals, cv)
		default:
			return nil, fmt.Errorf("json_format %s%s: values must be strings or objects (Envoy: \"The dictionary must map strings to strings\")", path, k)
		}
	}
	return o, nil
}

func compileValue(s string, formatters []string) (*value, error) {
	v := &value{text: s}
	rest := s
	for rest != "" {
		i := strings.IndexByte(rest, '%')
		if i < 0 {
			v.parts = append(v.parts, part{lit: rest})
			break
		}
		if i > 0 {
			v.parts = append(v.parts, part{lit: rest[:i]})
		}
		rest = rest[i+1:]
		j := strings.IndexByte(rest, '%')
		// Operators with arguments may contain '%' only inside (...), as
		// START_TIME's strftime format does; the dev proxy supports none.
		if j < 0 {
			return nil, fmt.Errorf("unterminated command operator in %q", s)
		}
		op, err := parseOperator(rest[:j], formatters)
		if err != nil {
			return nil, err
		}
		v.parts = append(v.parts, part{op: op})
		rest = rest[j+1:]
	}
	v.typed = len(v.parts) == 1 && v.parts[0].op != nil
	return v, nil
}

// Operators whose value is a number in typed JSON (usage.rst: "Renders a
// numeric value in typed JSON logs").
var numeric = map[string]bool{"RESPONSE_CODE": true, "DURATION": true, "BYTES_RECEIVED": true, "BYTES_SENT": true}

// celAttributes are the CEL expressions %CEL(...)% may name here: single
// attributes (Envoy docs intro/arch_overview/advanced/attributes.rst).
var celAttributes = map[string]bool{"request.query": true, "request.path": true, "request.url_path": true,
	"request.method": true, "request.host": true, "request.id": true, "request.scheme": true, "response.code": true}

func parseOperator(tok string, formatters []string) (*operator, error) {
	op := &operator{name: tok}
	if i := strings.IndexByte(tok, '('); i >= 0 {
		end := strings.LastIndexByte(tok, ')')
		if end < i {
			return nil, fmt.Errorf("%%%s%%: unbalanced parentheses", tok)
		}
		op.name, op.arg = tok[:i], tok[i+1:end]
		if suffix := tok[end+1:]; suffix != "" {
			n, err := strconv.Atoi(strings.TrimPrefix(suffix, ":"))
			if !strings.HasPrefix(suffix, ":") || err != nil || n <= 0 {
				return nil, fmt.Errorf("%%%s%%: bad length suffix %q", tok, suffix)
			}
			op.maxLen = n
		}
	}
	has := func(ext string) bool {
		for _, f := range formatters {
			if f == ext {
				return true
			}
		}
		return false
	}
	switch op.name {
	case "START_TIME":
		if op.arg != "" {
			return nil, fmt.Errorf("%%START_TIME(%s)%%: the dev proxy supports only the default format", op.arg)
		}
	case "REQ", "REQUEST_HEADER", "RESP", "RESPONSE_HEADER", "REQ_WITHOUT_QUERY":
		if op.name == "REQ_WITHOUT_QUERY" && !has(reqWOQName) {
			return nil, fmt.Errorf("%%REQ_WITHOUT_QUERY%% needs the formatter extension %s (as in Envoy)", reqWOQName)
		}
		if op.arg == "" {
			return nil, fmt.Errorf("%%%s%%: a header name is required", op.name)
		}
		op.arg = strings.ToLower(op.arg)
		if a, b, ok := strings.Cut(op.arg, "?"); ok {
			op.arg, op.alt = a, b
		}
	case "FILTER_STATE":
		key, f, _ := strings.Cut(op.arg, ":")
		if f != "PLAIN" {
			return nil, fmt.Errorf("%%FILTER_STATE(%s)%%: the dev proxy renders only :PLAIN (a Wasm property is a CelState whose TYPED form is a base64 BytesValue, envoy#38795)", op.arg)
		}
		op.arg, op.plain = key, true
	case "ENVIRONMENT":
		if op.arg == "" {
			return nil, fmt.Errorf("%%ENVIRONMENT%%: a variable name is required")
		}
	case "CEL":
		if !has(celFormatter) {
			return nil, fmt.Errorf("%%CEL%% needs the formatter extension %s (as in Envoy)", celFormatter)
		}
		if !celAttributes[op.arg] {
			return nil, fmt.Errorf("%%CEL(%s)%%: the dev proxy evaluates only single attributes (%s)", op.arg, strings.Join(sortedKeys(celAttributes), ", "))
		}
	case "RESPONSE_CODE", "RESPONSE_CODE_DETAILS", "RESPONSE_FLAGS", "DURATION", "PROTOCOL",
		"DOWNSTREAM_REMOTE_ADDRESS", "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT",
		"DOWNSTREAM_LOCAL_ADDRESS", "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT",
		"UPSTREAM_HOST", "UPSTREAM_CLUSTER", "BYTES_RECEIVED", "BYTES_SENT":
		if op.arg != "" {
			return nil, fmt.Errorf("%%%s%% takes no argument", op.name)
		}
	default:
		return nil, fmt.Errorf("%%%s%%: command operator not implemented by the dev proxy (supported: START_TIME, REQ, REQUEST_HEADER, RESP, RESPONSE_HEADER, REQ_WITHOUT_QUERY, FILTER_STATE(...:PLAIN), ENVIRONMENT, CEL, RESPONSE_CODE, RESPONSE_CODE_DETAILS, RESPONSE_FLAGS, DURATION, PROTOCOL, DOWNSTREAM_REMOTE_ADDRESS[_WITHOUT_PORT], DOWNSTREAM_LOCAL_ADDRESS[_WITHOUT_PORT], UPSTREAM_HOST, UPSTREAM_CLUSTER, BYTES_RECEIVED, BYTES_SENT)", op.name)
	}
	return op, nil
}

func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Line renders e as one JSON object followed by a newline.
func (f *Format) Line(e *LogEntry) []byte {
	b, err := json.Marshal(f.render(f.root, e))
	if err != nil { // only strings, numbers, nulls and maps: cannot happen
		b = []byte(`{"devproxy_error":` + strconv.Quote(err.Error()) + `}`)
	}
	return append(b, '\n')
}

func (f *Format) render(o *object, e *LogEntry) map[string]any {
	out := make(map[string]any, len(o.keys))
	for i, k := range o.keys {
		switch v := o.vals[i].(type) {
		case *object:
			out[k] = f.render(v, e)
		case *value:
			out[k] = f.renderValue(v, e)
		}
	}
	return out
}

func (f *Format) renderValue(v *value, e *LogEntry) any {
	if v.typed {
		op := v.parts[0].op
		s, ok := f.eval(op, e)
		if !ok {
			return nil
		}
		if numeric[op.name] {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n
			}
		}
		return s
	}
	var b strings.Builder
	for _, p := range v.parts {
		if p.op == nil {
			b.WriteString(p.lit)
			continue
		}
		if s, ok := f.eval(p.op, e); ok && s != "" {
			b.WriteString(s)
		} else {
			b.WriteString("-")
		}
	}
	return b.String()
}

// eval returns the operator's value and whether it has one.
func (f *Format) eval(op *operator, e *LogEntry) (string, bool) {
	s, ok := f.evalRaw(op, e)
	if ok && op.maxLen > 0 && len(s) > op.maxLen {
		s = s[:op.maxLen]
	}
	return s, ok
}

func (f *Format) evalRaw(op *operator, e *LogEntry) (string, bool) {
	switch op.name {
	case "START_TIME":
		// Envoy's default: %Y-%m-%dT%H:%M:%E3SZ, UTC, e.g. 2016-04-15T20:17:00.310Z.
		return e.Start.UTC().Format("2006-01-02T15:04:05.000Z"), true
	case "REQ", "REQUEST_HEADER":
		return header(e.RequestHeaders, op.arg, op.alt)
	case "RESP", "RESPONSE_HEADER":
		return header(e.ResponseHeaders, op.arg, op.alt)
	case "REQ_WITHOUT_QUERY":
		s, ok := header(e.RequestHeaders, op.arg, op.alt)
		if i := strings.IndexByte(s, '?'); ok && i >= 0 {
			s = s[:i]
		}
		return s, ok
	case "FILTER_STATE":
		s, ok := e.FilterState[op.arg]
		return s, ok
	case "ENVIRONMENT":
		// An unset variable is "-", a string even in json_format: Envoy's
		// EnvironmentFormatter stores DefaultUnspecifiedValueString when
		// getenv finds nothing (source/common/formatter/stream_info_formatter.cc).
		if v, ok := f.env(op.arg); ok {
			return v, true
		}
		return "-", true
	case "CEL":
		return celAttribute(op.arg, e)
	case "RESPONSE_CODE":
		return strconv.Itoa(e.ResponseCode), true
	case "RESPONSE_CODE_DETAILS":
		return e.Details, e.Details != ""
	case "RESPONSE_FLAGS":
		return e.Flags, e.Flags != ""
	case "DURATION":
		return strconv.FormatInt(e.Duration.Milliseconds(), 10), true
	case "PROTOCOL":
		return e.Protocol, e.Protocol != ""
	case "DOWNSTREAM_REMOTE_ADDRESS":
		return e.Remote, e.Remote != ""
	case "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT":
		return withoutPort(e.Remote)
	case "DOWNSTREAM_LOCAL_ADDRESS":
		return e.Local, e.Local != ""
	case "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT":
		return withoutPort(e.Local)
	case "UPSTREAM_HOST":
		return e.UpstreamHost, e.UpstreamHost != ""
	case "UPSTREAM_CLUSTER":
		return e.UpstreamCluster, e.UpstreamCluster != ""
	case "BYTES_RECEIVED":
		return strconv.FormatInt(e.BytesReceived, 10), true
	case "BYTES_SENT":
		return strconv.FormatInt(e.BytesSent, 10), true
	}
	return "", false
}

// header is %REQ(name?alt)%: the first value of name, else of alt.
func header(h host.Headers, name, alt string) (string, bool) {
	if v, ok := h.Lookup(name); ok {
		return v, true
	}
	if alt != "" {
		return h.Lookup(alt)
	}
	return "", false
}

func withoutPort(addr string) (string, bool) {
	if addr == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h, true
	}
	return addr, true
}

// celAttribute evaluates the attributes of celAttributes as Envoy defines
// them (attributes.rst): request.path with the query, request.url_path
// without, request.query the part after '?' ("" when none).
func celAttribute(attr string, e *LogEntry) (string, bool) {
	path := e.RequestHeaders.Get(":path")
	switch attr {
	case "request.query":
		_, q, _ := strings.Cut(path, "?")
		return q, true
	case "request.path":
		return path, true
	case "request.url_path":
		p, _, _ := strings.Cut(path, "?")
		return p, true
	case "request.method":
		return e.RequestHeaders.Lookup(":method")
	case "request.host":
		return e.RequestHeaders.Lookup(":authority")
	case "request.scheme":
		return e.RequestHeaders.Lookup(":scheme")
	case "request.id":
		return e.RequestHeaders.Lookup("x-request-id")
	case "response.code":
		return strconv.Itoa(e.ResponseCode), e.ResponseCode != 0
	}
	return "", false
}
