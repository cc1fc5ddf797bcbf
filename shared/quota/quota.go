// Package quota holds the messages of sluice's quota protocol and their JSON codec:
// what an Envoy sends the control plane's quota service (POST /v1/quota) for the
// counter keys of fleet-scoped rules, and what the service answers. Both sides
// encode and decode with this one package.
//
// It uses the standard library and package strictjson only (no os, fmt or
// encoding/json), so the proxy-wasm filter can import it.
//
// # The exchange
//
// An Envoy (identified by Request.Envoy) holds, for each key it was granted, a lease:
// a number of units it may admit locally until the lease expires. Periodically, and
// when a key runs dry, it sends one batched Request: for each key, the units it
// admitted since its last report (Used, which sizes the next grant), the unused units
// of its lease it gives back (Return; it stops using them when it sends the request)
// and the units it would like (Want). The service answers each key with a KeyResult:
// the units granted now, added to the lease, and the lease's expiry, relative to the
// service's clock when it decided (ExpiresIn). The Envoy must measure ExpiresIn from
// the moment it sent the request, never from when the answer arrived, so that its
// lease always ends before the service's. Units not spent by then are lost to the
// Envoy; the service never credits them back (see docs/fleet.md for
// the bound per algorithm).
//
// # Documents
//
// A request:
//
//	{"envoy": "ingress-0", "policy": "default", "version": 7, "env": "prod",
//	 "interval": "1s",
//	 "keys": [{"rule": "per-user", "key": "rl:prod:default/per-user:user=alice:60s",
//	           "used": 12, "return": 0, "want": 100}]}
//
// An answer (HTTP 200), one result per requested key, in request order:
//
//	{"policy": "default", "version": 7, "now": 1763890000000000000,
//	 "keys": [{"key": "rl:prod:default/per-user:user=alice:60s", "status": "granted",
//	           "granted": 40, "held": 40, "returned": 0,
//	           "expires_in_ns": 41000000000, "retry_after_ns": 0}]}
//
// Durations on the wire are integer nanoseconds (exact, no float), except the request's
// "interval", a duration string as in policies ("1s", "250ms").
package quota

import (
	"errors"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// Protocol bounds.
const (
	// MaxEnvoyBytes is the longest Envoy id.
	MaxEnvoyBytes = 128
	// MaxKeyBytes is the longest counter key (rules.MaxKeyBytes: no rule builds
	// a longer one).
	MaxKeyBytes = rules.MaxKeyBytes
	// DefaultMaxKeys is the default largest number of keys in one request.
	DefaultMaxKeys = 1000
	// DefaultMaxBytes is the default largest request document: 1 MiB.
	DefaultMaxBytes = 1 << 20
	// DefaultInterval is the report interval assumed when a request gives none.
	DefaultInterval = time.Second
	// MinInterval and MaxInterval bound Request.Interval.
	MinInterval = 10 * time.Millisecond
	MaxInterval = time.Minute
	// MaxUnits bounds Used, Return and Want: limit.MaxLimit.
	MaxUnits = limit.MaxLimit
)

// Request is one Envoy's batched report and ask. JSON names in brackets.
type Request struct {
	// Envoy ["envoy"] identifies the Envoy (pod name, host:port): 1 to MaxEnvoyBytes
	// printable ASCII bytes, no space. Required. Leases are per Envoy.
	Envoy string
	// Policy ["policy"] is the name of the policy the Envoy enforces. Required.
	Policy string
	// Version ["version"] is the version of that policy the Envoy enforces (>= 1).
	// Required: a key is answered StatusStalePolicy unless it is the current one.
	Version uint64
	// Env ["env"] is the environment name in the Envoy's counter keys (default
	// "default").
	Env string
	// Interval ["interval"] is how often the Envoy reports (default DefaultInterval,
	// MinInterval..MaxInterval); grants are sized for a little more than one.
	Interval time.Duration
	// Keys ["keys"]: one entry per counter key, each key at most once. Required,
	// non-empty.
	Keys []KeyRequest
}

// KeyRequest is the report and ask for one counter key.
type KeyRequest struct {
	// Rule ["rule"] is the id of the rule the key belongs to. Required.
	Rule string
	// Key ["key"] is the counter key as the filter builds it (rules.Compiled.AppendKey),
	// 1 to MaxKeyBytes bytes. Required.
	Key string
	// Used ["used"]: units admitted under this key since the Envoy's last report.
	Used uint64
	// Return ["return"]: unused units of the current lease the Envoy gives back.
	Return uint64
	// Want ["want"]: units asked for; 0 only reports and returns.
	Want uint64
	// Charge ["charge"]: units the Envoy admitted under this key without a lease
	// since its last report (on_quota_failure "local" or "pass", while it could
	// not reach the service), booked against the key's budget once, even past
	// the limit, so that later grants shrink by what was admitted. Written only
	// when non-zero; a client sends it only to a service whose answer said
	// Response.Charges (a service that predates the field refuses the member).
	Charge uint64
}

// The values of KeyResult.Status.
const (
	// StatusGranted: all of Want was granted (or Want was 0); or, with Granted
	// 0, a fixed window's top-up held back: the Envoy holds its fair share of
	// the window with units unspent, and what is left is the other Envoys' due
	// (it keeps its lease and asks again at its next report).
	StatusGranted = "granted"
	// StatusPartial: less than Want but at least one unit was granted.
	StatusPartial = "partial"
	// StatusRefused: the key's budget is spent: nothing could be granted now, and
	// RetryAfter says when more may be. The service answers it only when the
	// limiter has no unit left, never because the key was contended or its
	// ledger full (StatusRetry).
	StatusRefused = "refused"
	// StatusRetry: the service could not decide the key in time (its store was
	// contended or slow): nothing was granted, returned or recorded for it, used
	// units included. The Envoy keeps its lease as it was (units it sent back may
	// be taken back into a lease that is still live), reports the same use again,
	// decides meanwhile as the rule's on_quota_failure says, and asks again after
	// RetryAfter. It never means the budget is spent.
	StatusRetry = "retry"
	// StatusStalePolicy: the request's policy version is not the current one; the
	// Envoy must resync its policy. Nothing was granted or returned.
	StatusStalePolicy = "stale_policy"
	// StatusUnknownRule: the current policy has no rule of that id.
	StatusUnknownRule = "unknown_rule"
	// StatusNotFleet: the rule is not fleet-scoped; the Envoy counts it locally.
	StatusNotFleet = "not_fleet"
	// StatusBadKey: the key is not one the rule can build.
	StatusBadKey = "bad_key"
)

// Recorded reports whether a key answered status had its report recorded by the
// service (its used units, returns and charge taken): StatusGranted,
// StatusPartial or StatusRefused. Retry and the policy mismatches record
// nothing.
func Recorded(status string) bool {
	return status == StatusGranted || status == StatusPartial || status == StatusRefused
}

// Response is the service's answer to a Request (HTTP 200).
type Response struct {
	// Policy ["policy"] and Version ["version"] are the current policy and version
	// (Version 0 when the policy does not exist).
	Policy  string
	Version uint64
	// Now ["now"] is the service's clock when it decided, Unix nanoseconds
	// (diagnostic: the Envoy must not compare it with its own clock).
	Now int64
	// Keys ["keys"]: one result per requested key, in request order.
	Keys []KeyResult
	// Charges ["charges"]: the service books KeyRequest.Charge. Written, as true,
	// only when the request carried ChargeHeader, so a client built before the
	// field never receives it.
	Charges bool
}

// KeyResult is the answer for one key.
type KeyResult struct {
	// Key ["key"] is the requested key.
	Key string
	// Status ["status"] is one of the Status constants.
	Status string
	// Granted ["granted"]: units added to the Envoy's lease now.
	Granted uint64
	// Held ["held"]: units of the lease the service counts as the Envoy's after this
	// call (granted, neither reported used nor returned), valid until ExpiresIn.
	Held uint64
	// Returned ["returned"]: units of Return credited back to the global state
	// (less than Return when the lease had expired or held less).
	Returned uint64
	// ExpiresIn ["expires_in_ns"]: the lease ends this long after the service decided
	// (0 when nothing is held). Never past the end of the window or slot the units were
	// counted in.
	ExpiresIn time.Duration
	// RetryAfter ["retry_after_ns"]: for StatusRefused and StatusPartial, the time
	// until more units may be available (limit.Never, 2^63-1, if never); for
	// StatusRetry, when to ask again.
	RetryAfter time.Duration
	// Envoys ["envoys"]: how many Envoys share the key now (those that reported
	// in the last three report intervals, at least 15 s, this one included); 0
	// when unknown.
	// An Envoy that cannot reach the service enforces about 1/Envoys of the limit
	// by itself (on_quota_failure "local"). Written only when the request carried
	// EnvoysHeader, so an Envoy built before the field never receives it.
	Envoys uint32
	// Left ["left"] and LeftFor ["left_for_ns"]: for a fixed_window rule, this
	// Envoy's share of what the window had left beyond every lease once this
	// answer was decided, ⌊remaining/Envoys⌋ units, and how long that window
	// still runs from the decision (until its end; never 0 when written). An
	// Envoy that cannot reach the service admits by itself (on_quota_failure
	// "local") at most Left units in that window, not its share of the limit.
	// Written only when the request carried LeftHeader (LeftFor 0: not said).
	Left    uint64
	LeftFor time.Duration
}

// LeftHeader is the HTTP request header by which a quota client says it reads
// KeyResult.Left and LeftFor (any non-empty value), negotiated as EnvoysHeader.
const LeftHeader = "sluice-quota-left"

// EnvoysHeader is the HTTP request header by which a quota client says it reads
// KeyResult.Envoys (any non-empty value): servers that predate the field ignore
// the header, clients that predate it never send it, so neither strict codec ever
// meets a member it does not know.
const EnvoysHeader = "sluice-quota-envoys"

// ChargeHeader is the HTTP request header by which a quota client says it reads
// Response.Charges (any non-empty value). A service that books charges answers it
// with Charges true; from then on the client may send KeyRequest.Charge. Neither
// strict codec of an older build ever meets a member it does not know: an older
// service never says Charges, so it is never sent a charge.
const ChargeHeader = "sluice-quota-charge"

// Limits bound a request document.
type Limits struct {
	// MaxBytes is the largest document (default DefaultMaxBytes).
	MaxBytes int
	// MaxKeys is the largest number of keys (default DefaultMaxKeys).
	MaxKeys int
}

// FieldError is one problem in a document: Field is its JSON path
// ("keys[3].want"), "" for the document as a whole.
type FieldError struct {
	Field   string
	Message string
}

// Error returns "field: message".
func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// Errors lists the problems of a malformed document (an HTTP 400), in document order.
type Errors []FieldError

// Error joins the problems with "; ".
func (es Errors) Error() string {
	s := ""
	for i, e := range es {
		if i > 0 {
			s += "; "
		}
		s += e.Error()
	}
	return s
}

// ErrTooLarge is matched (errors.Is) by the *TooLargeError DecodeRequest returns for a
// document over Limits (an HTTP 413).
var ErrTooLarge = errors.New("quota: request too large")

// TooLargeError says which limit a document exceeds.
type TooLargeError struct {
	// Field is "keys" for too many keys, "" for too many bytes.
	Field   string
	Message string
}

// Error returns the message.
func (e *TooLargeError) Error() string { return e.Message }

// Is reports whether target is ErrTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

const maxDepth = 4

func validEnvoy(s string) bool {
	if len(s) == 0 || len(s) > MaxEnvoyBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

var errStop = errors.New("stop")

// DecodeRequest decodes and validates a request document strictly (strictjson: no
// unknown fields, no duplicate members, exact integers). It returns a
// *TooLargeError when data is over lim.MaxBytes or holds more than lim.MaxKeys keys,
// Errors naming every bad field otherwise, or the request.
func DecodeRequest(data []byte, lim Limits) (*Request, error) {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxKeys <= 0 {
		lim.MaxKeys = DefaultMaxKeys
	}
	if len(data) > lim.MaxBytes {
		return nil, &TooLargeError{Message: "request is " + strconv.Itoa(len(data)) + " bytes, more than the limit of " + strconv.Itoa(lim.MaxBytes)}
	}
	rd := &requestDecoder{d: strictjson.NewDecoder(data, strictjson.Limits{MaxBytes: lim.MaxBytes, MaxDepth: maxDepth}), r: &Request{}, maxKeys: lim.MaxKeys}
	_ = rd.d.Object(rd.member)
	if rd.tooMany {
		return nil, &TooLargeError{Field: "keys", Message: "keys: more than the limit of " + strconv.Itoa(lim.MaxKeys) + " keys in one request"}
	}
	_ = rd.d.End()
	var errs Errors
	syntax := false
	for _, e := range rd.d.Errors() {
		errs = append(errs, FieldError{Field: e.Path, Message: e.Message})
		syntax = syntax || e.Syntax
	}
	if !syntax {
		errs = append(errs, rd.missing()...)
	}
	if errs != nil {
		return nil, errs
	}
	r := rd.r
	if r.Env == "" {
		r.Env = "default"
	}
	if r.Interval == 0 {
		r.Interval = DefaultInterval
	}
	return r, nil
}

// requestDecoder is DecodeRequest's state: the request as decoded so far and
// which required members were seen.
type requestDecoder struct {
	d       *strictjson.Decoder
	r       *Request
	maxKeys int
	seen    [4]bool   // envoy, policy, version, keys
	present [][2]bool // per key: rule, key
	tooMany bool      // more than maxKeys keys
}

// member decodes one member of the request object.
func (rd *requestDecoder) member(key string) error {
	d, r := rd.d, rd.r
	switch key {
	case "envoy":
		rd.seen[0] = true
		if s, err := d.String(); err == nil {
			if !validEnvoy(s) {
				d.Fail("must be 1 to " + strconv.Itoa(MaxEnvoyBytes) + " printable ASCII bytes without spaces")
			}
			r.Envoy = s
		}
	case "policy":
		rd.seen[1] = true
		if s, err := d.String(); err == nil {
			if !rules.ValidName(s) {
				d.Fail("must be a valid policy name")
			}
			r.Policy = s
		}
	case "version":
		rd.seen[2] = true
		if v, err := d.Uint64(); err == nil {
			if v == 0 {
				d.Fail("must be >= 1")
			}
			r.Version = v
		}
	case "env":
		if s, err := d.String(); err == nil {
			if !rules.ValidName(s) {
				d.Fail("must be a valid environment name")
			}
			r.Env = s
		}
	case "interval":
		if v, err := d.Duration(); err == nil {
			if v < MinInterval || v > MaxInterval {
				d.Fail("must be between " + MinInterval.String() + " and " + MaxInterval.String())
			}
			r.Interval = v
		}
	case "keys":
		rd.seen[3] = true
		return d.Array(rd.key)
	default:
		return d.UnknownField()
	}
	return nil
}

// key decodes keys[i], stopping the document past maxKeys.
func (rd *requestDecoder) key(i int) error {
	if i >= rd.maxKeys {
		rd.tooMany = true
		return errStop
	}
	rd.r.Keys = append(rd.r.Keys, KeyRequest{})
	rd.present = append(rd.present, [2]bool{})
	k, p, d := &rd.r.Keys[i], &rd.present[i], rd.d
	return d.Object(func(name string) error {
		switch name {
		case "rule":
			p[0] = true
			if s, err := d.String(); err == nil {
				if !rules.ValidID(s) {
					d.Fail("must be a valid rule id")
				}
				k.Rule = s
			}
		case "key":
			p[1] = true
			if s, err := d.String(); err == nil {
				if len(s) == 0 || len(s) > MaxKeyBytes {
					d.Fail("must be 1 to " + strconv.Itoa(MaxKeyBytes) + " bytes")
				}
				k.Key = s
			}
		case "used":
			k.Used = units(d)
		case "return":
			k.Return = units(d)
		case "want":
			k.Want = units(d)
		case "charge":
			k.Charge = units(d)
		default:
			return d.UnknownField()
		}
		return nil
	})
}

// missing names the required members the document lacked, an empty key list
// and duplicate keys.
func (rd *requestDecoder) missing() Errors {
	var errs Errors
	r := rd.r
	for i, name := range [...]string{"envoy", "policy", "version", "keys"} {
		if !rd.seen[i] {
			errs = append(errs, FieldError{Field: name, Message: "required"})
		}
	}
	if rd.seen[3] && len(r.Keys) == 0 {
		errs = append(errs, FieldError{Field: "keys", Message: "must hold at least one key"})
	}
	dup := make(map[string]int, len(r.Keys))
	for i := range r.Keys {
		f := "keys[" + strconv.Itoa(i) + "]"
		if !rd.present[i][0] {
			errs = append(errs, FieldError{Field: f + ".rule", Message: "required"})
		}
		if !rd.present[i][1] {
			errs = append(errs, FieldError{Field: f + ".key", Message: "required"})
		} else if j, ok := dup[r.Keys[i].Key]; ok {
			errs = append(errs, FieldError{Field: f + ".key", Message: "duplicate of keys[" + strconv.Itoa(j) + "].key"})
		} else {
			dup[r.Keys[i].Key] = i
		}
	}
	return errs
}

func units(d *strictjson.Decoder) uint64 {
	v, err := d.Uint64()
	if err != nil {
		return 0
	}
	if v > MaxUnits {
		d.Fail("must be <= " + strconv.FormatUint(MaxUnits, 10))
		return 0
	}
	return v
}

// AppendRequest appends r as canonical JSON (members in the order of the struct
// fields; "env" and "interval" omitted when zero; "used", "return", "want" always
// written; "charge" only when non-zero) to dst. It does not validate r.
func AppendRequest(dst []byte, r *Request) []byte {
	w := strictjson.NewWriter(dst)
	w.BeginObject()
	w.AppendKey("envoy")
	w.AppendString(r.Envoy)
	w.AppendKey("policy")
	w.AppendString(r.Policy)
	w.AppendKey("version")
	w.AppendUint(r.Version)
	if r.Env != "" {
		w.AppendKey("env")
		w.AppendString(r.Env)
	}
	if r.Interval != 0 {
		w.AppendKey("interval")
		w.AppendDuration(r.Interval)
	}
	w.AppendKey("keys")
	w.BeginArray()
	for i := range r.Keys {
		k := &r.Keys[i]
		w.BeginObject()
		w.AppendKey("rule")
		w.AppendString(k.Rule)
		w.AppendKey("key")
		w.AppendString(k.Key)
		w.AppendKey("used")
		w.AppendUint(k.Used)
		w.AppendKey("return")
		w.AppendUint(k.Return)
		w.AppendKey("want")
		w.AppendUint(k.Want)
		if k.Charge > 0 {
			w.AppendKey("charge")
			w.AppendUint(k.Charge)
		}
		w.EndObject()
	}
	w.EndArray()
	w.EndObject()
	return w.Bytes()
}

// AppendResponse appends r as canonical JSON (members in the order of the struct
// fields; a key's "envoys" only when non-zero, "left" and "left_for_ns" only
// when LeftFor is positive, "charges" only when true) to dst.
func AppendResponse(dst []byte, r *Response) []byte {
	w := strictjson.NewWriter(dst)
	w.BeginObject()
	w.AppendKey("policy")
	w.AppendString(r.Policy)
	w.AppendKey("version")
	w.AppendUint(r.Version)
	w.AppendKey("now")
	w.AppendInt(r.Now)
	w.AppendKey("keys")
	w.BeginArray()
	for i := range r.Keys {
		k := &r.Keys[i]
		w.BeginObject()
		w.AppendKey("key")
		w.AppendString(k.Key)
		w.AppendKey("status")
		w.AppendString(k.Status)
		w.AppendKey("granted")
		w.AppendUint(k.Granted)
		w.AppendKey("held")
		w.AppendUint(k.Held)
		w.AppendKey("returned")
		w.AppendUint(k.Returned)
		w.AppendKey("expires_in_ns")
		w.AppendInt(int64(k.ExpiresIn))
		w.AppendKey("retry_after_ns")
		w.AppendInt(int64(k.RetryAfter))
		if k.Envoys > 0 {
			w.AppendKey("envoys")
			w.AppendUint(uint64(k.Envoys))
		}
		if k.LeftFor > 0 {
			w.AppendKey("left")
			w.AppendUint(k.Left)
			w.AppendKey("left_for_ns")
			w.AppendInt(int64(k.LeftFor))
		}
		w.EndObject()
	}
	w.EndArray()
	if r.Charges {
		w.AppendKey("charges")
		w.AppendBool(true)
	}
	w.EndObject()
	return w.Bytes()
}

// DecodeResponse decodes an answer strictly; unknown members are errors (the two
// sides are built from one codec). It returns Errors naming every bad field.
func DecodeResponse(data []byte) (*Response, error) {
	d := strictjson.NewDecoder(data, strictjson.Limits{MaxBytes: 64 << 20, MaxDepth: maxDepth})
	r := &Response{}
	_ = d.Object(func(key string) error {
		switch key {
		case "policy":
			r.Policy, _ = d.String()
		case "version":
			r.Version, _ = d.Uint64()
		case "now":
			r.Now, _ = d.Int64()
		case "keys":
			return d.Array(func(i int) error {
				r.Keys = append(r.Keys, KeyResult{})
				k := &r.Keys[i]
				return d.Object(func(name string) error {
					switch name {
					case "key":
						k.Key, _ = d.String()
					case "status":
						k.Status, _ = d.String()
					case "granted":
						k.Granted, _ = d.Uint64()
					case "held":
						k.Held, _ = d.Uint64()
					case "returned":
						k.Returned, _ = d.Uint64()
					case "expires_in_ns":
						v, _ := d.Int64()
						k.ExpiresIn = time.Duration(v)
					case "retry_after_ns":
						v, _ := d.Int64()
						k.RetryAfter = time.Duration(v)
					case "envoys":
						v, _ := d.Uint64()
						k.Envoys = uint32(min(v, 1<<32-1))
					case "left":
						k.Left, _ = d.Uint64()
					case "left_for_ns":
						v, _ := d.Int64()
						k.LeftFor = time.Duration(max(v, 0))
					default:
						return d.UnknownField()
					}
					return nil
				})
			})
		case "charges":
			r.Charges, _ = d.Bool()
		default:
			return d.UnknownField()
		}
		return nil
	})
	_ = d.End()
	var errs Errors
	for _, e := range d.Errors() {
		errs = append(errs, FieldError{Field: e.Path, Message: e.Message})
	}
	if errs != nil {
		return nil, errs
	}
	return r, nil
}
