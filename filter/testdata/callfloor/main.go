// Command callfloor is the second benchmark floor for the sluice filter: a
// proxy-wasm plugin on the same binding (filter/proxywasm) that makes the
// host calls sluice's one-rule request makes, with as little Go work
// between them as the binding allows, and decides nothing. Where the floor
// plugin (testdata/floor) measures a plugin that only reads the request,
// callfloor measures what sluice's design costs before any of its logic:
// an exact counter shared by the worker VMs (a shared-data read and a CAS
// write) and a decision in the access log (a filter-state write).
//
// Per request it reads :path and x-user-id and the clock, reads the
// shared-data value of one of 1,024 keys (chosen by the user, as sluice
// chooses a counter bucket), writes back 560 bytes by compare-and-swap (the
// size of a token-bucket rule's bucket with 16 entries), and sets the
// filter state "sluice" to 160 bytes of JSON. With the plugin configuration
// "deny" it instead answers every request as sluice answers a denied one:
// the same reads without the CAS write, then x-request-id, the filter
// state, and a 429 local reply with five headers and a 160-byte body
// (the first request to a key, which finds no value, writes it instead,
// as the request that spent a limit does). With "rules=N" (N from 1 to 8)
// an allowed request reads and writes back one such bucket for each of N
// rules, as sluice's request does for N rules that match it, each in its
// own 1,024 keys.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o callfloor.wasm ./filter/testdata/callfloor
package main

import (
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vm{}) }

func main() {}

const (
	buckets     = 1024
	bucketBytes = 560
)

var (
	state     = []string{"sluice"}
	stateJSON = []byte(`{"rate_limited":false,"shadow":false,"policy_version":1,"rule":"per-user","key":"rl:bench:default/per-user:user=user-0001:60s","limit":1000,"remaining":999,"reset":1}`)
	replyBody = []byte(`{"code":429,"message":"rate limit exceeded","data":{"rule":"per-user","limit":1,"remaining":0,"reset":3600},"timestamp":"2026-11-25T22:01:05Z","trace_id":"`)
	// headers are encoded once, as sluice keeps a reply's encoded headers
	// for the next reply of the same numbers and rule.
	headers = pairs.AppendEncode(nil, [][2]string{{"content-type", "application/json"}, {"retry-after", "3600"},
		{"x-ratelimit-limit", "1"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "3600"}})
	scratch = make([]byte, bucketBytes)
	body    = make([]byte, 0, 512)
	sink    int64
)

// maxRules bounds "rules=N".
const maxRules = 8

type vm struct{ types.DefaultVMContext }

func (*vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct {
	types.DefaultPluginContext
	deny bool
	// keys[r][n] is bucket n of rule r (the configured rules only).
	keys [][buckets]string
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, _ := proxywasm.GetPluginConfiguration()
	p.deny = string(cfg) == "deny"
	rules := 1
	if v, ok := strings.CutPrefix(string(cfg), "rules="); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxRules {
			proxywasm.LogError("callfloor: rules=N wants N from 1 to 8")
			return types.OnPluginStartStatusFailed
		}
		rules = n
	}
	p.keys = make([][buckets]string, rules)
	for r := range p.keys {
		for n := range p.keys[r] {
			p.keys[r][n] = "callfloor/r" + strconv.Itoa(r) + "/" + strconv.Itoa(n)
		}
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(uint32) types.HttpContext { return &stream{p: p} }

type stream struct {
	types.DefaultHttpContext
	p *plugin
}

func (s *stream) OnHttpRequestHeaders(int, bool) types.Action {
	proxywasm.BeginHostScratch()
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	user, _ := proxywasm.GetHttpRequestHeader("x-user-id")
	now, _ := proxywasm.GetCurrentTimeNanoseconds()
	sink += now + int64(len(path))
	n := fnv1a(user) % buckets
	keys := s.p.keys
	key := keys[0][n]
	value, cas, err := proxywasm.GetSharedData(key)
	if err != nil {
		cas = 0
	}
	if s.p.deny && err == nil {
		id, _ := proxywasm.GetHttpRequestHeader("x-request-id")
		_ = proxywasm.SetProperty(state, stateJSON)
		b := append(append(append(body[:0], replyBody...), id...), '"', '}')
		_ = proxywasm.SendHttpResponseEncoded(429, "sluice_rate_limited", headers, b, proxywasm.GrpcStatusNone)
		return types.ActionPause
	}
	for r := 0; ; {
		copy(scratch, value)
		scratch[0]++
		_ = proxywasm.SetSharedData(key, scratch, cas)
		if r++; r == len(keys) {
			break
		}
		key = keys[r][n]
		if value, cas, err = proxywasm.GetSharedData(key); err != nil {
			cas = 0
		}
	}
	_ = proxywasm.SetProperty(state, stateJSON)
	return types.ActionContinue
}

// fnv1a is the 64-bit FNV-1a hash of s: the same in every worker VM (a
// maphash seed is per VM), so a user's requests meet one key whichever
// worker serves them, as sluice's keyed hash under its shared secret does.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}
