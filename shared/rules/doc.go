// Package rules is sluice's policy schema: the JSON documents the control plane
// stores and serves, their strict parsing and validation, and the compiled form the
// filter uses to match requests and build counter keys.
//
// It is shared by the control plane and the proxy-wasm filter, so it uses the
// standard library only and imports neither os nor anything that does (fmt, log,
// encoding/json): JSON goes through package strictjson. The IANA time zone database
// is embedded, since a wasm guest has no /usr/share/zoneinfo: Go's, each zone cut
// down to the rules in force from 2025 on ([LoadZone]; zones_gen.go, written by
// shared/rules/gen_zones.go).
//
// # Documents
//
// A policy document (at most MaxPolicyBytes bytes):
//
//	{
//	  "policy": "default",
//	  "version": 7,
//	  "identity": {"user_header": "x-user-id", "tenant_header": "x-tenant-id"},
//	  "exempt": {"cidrs": ["10.0.0.0/8"], "users": ["ops-bot"]},
//	  "response_headers": {"set": "ratelimit", "on_allow": true},
//	  "rules": [
//	    {
//	      "id": "login-per-ip",
//	      "description": "brute-force guard on login",
//	      "match": {"path_prefix": "/v1/auth/login", "methods": ["POST"],
//	                "headers": [{"name": "x-env", "exact": "prod"}]},
//	      "key": ["client_ip"],
//	      "algorithm": "time_wheel",
//	      "limit": 10,
//	      "window": "5m",
//	      "slots": 30
//	    }
//	  ]
//	}
//
// Every member is described on the field of [Policy], [Rule], [Match], [HeaderMatch],
// [Identity], [Exempt] and [ResponseHeaders] that holds it. [ParsePolicy] and [ParseRule] reject unknown
// members, values of the wrong type or out of range, and every violation of the
// bounds (MaxRules and the other constants); each problem is a [FieldError] with its
// JSON path, such as "rules[2].window: must be > 0", and all of them are returned
// together as [Errors]. The algorithm parameters' bounds are package limit's
// (limit.Config.Validate), reported at the rule's path. [EncodePolicy] writes the
// canonical form back.
//
// # Keys
//
// A rule's "key" lists the parts that tell its counters apart:
//
//	client_ip      the client address the filter determined (Request.ClientIP)
//	user           the value of the identity user_header
//	tenant         the value of the identity tenant_header
//	route          the rule's own route: its match path or path_prefix, "*" without
//	               one; constant per rule, so it only makes keys self-describing
//	method         the request method
//	path           the request path, without the query
//	header:<name>  the value of that request header (first occurrence)
//
// An absent or empty key means one global counter per rule. A request that lacks the
// value of a part (no user header, say; an empty value counts as missing) is not
// counted by the rule at all, unless the part names alternatives separated by '|':
// "user|client_ip" uses the user id, or the client IP when there is no user id; the
// first alternative that has a value wins. Because a header name may not contain '|'
// here, "header:a|b" means header a, else the part b.
//
// The counter key of a request under rule R of policy P is
//
//	rl:{env}:{P}/{R}:{identifier}:{period}s
//
// where env is CompileOptions.Env (same charset as policy names, default "default"),
// period is the rule's window in whole seconds rounded up (86400 for a calendar
// day, 0 for concurrency), and identifier is "*" for a global key, or else one
// tag=value per key part, joined by '|', in the order of the key. The tag names the
// alternative that supplied the value: ip, user, tenant, route, method, path, or
// h.<name> for a header. Values (and tags) are percent-escaped: every byte outside
// printable ASCII, and '%', ':', '|' and '=', is written %XX (upper-case hex), so a
// value can never forge a separator. A value longer than [MaxKeyValueBytes] once
// escaped is written as "%S" and the unpadded base64url SHA-256 of the value (45
// bytes), so no value a client sends makes a key longer than [MaxKeyBytes] or
// sends its request down another path; no escaped value begins with "%S".
// Examples, with env "prod" and policy "default":
//
//	key ["client_ip"], window 5m, client 203.0.113.7:
//	    rl:prod:default/login-per-ip:ip=203.0.113.7:300s
//	key ["user|client_ip", "method"], window 1m, no user header, IPv6 client:
//	    rl:prod:default/api:ip=2001%3Adb8%3A%3A1|method=GET:60s
//	key ["tenant", "header:x-api-key"], window 1h, tenant "a|b", key "k:1":
//	    rl:prod:default/keys:tenant=a%7Cb|h.x-api-key=k%3A1:3600s
//	no key, concurrency:
//	    rl:prod:default/inflight:*:0s
//
// Distinct (env, policy, rule, key values, period) give distinct strings: env,
// policy and rule ids contain no ':' or '/', and escaped values contain no ':', '|'
// or '='. [Compiled.AppendKey] builds it into a caller's buffer without allocating.
//
// # Requests
//
// The filter describes a request with a [Request]: method, path without the query,
// headers, the client IP and the user and tenant. The client IP is the filter's
// business (it takes Envoy's trusted client address, source.address, which Envoy
// works out from use_remote_address and xff_num_trusted_hops); this package
// compares whatever address it is given, with IPv4-mapped IPv6 addresses unmapped.
//
// # Failure policy
//
// Everything that can be wrong with a policy is found when it is parsed or compiled:
// the filter keeps its last good policy when a new one fails. Per request nothing here
// fails: a missing key part means the rule does not count the request, a missing or
// malformed cost header means the rule's constant cost is used, and the caller is told
// so it can log and count it.
package rules
