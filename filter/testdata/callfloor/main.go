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
// as the request that spent a limit does).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o callfloor.wasm ./filter/testdata/callfloor
package main

import (
	"strconv"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vm{}) }

func main() {}

const (
	buckets     = 1024
	bucketBytes = 560
)

var (
	keys      [buckets]string
	state     = []string{"sluice"}
	stateJSON = []byte(`{"rate_limited":false,"shadow":false,"policy_version":1,"rule":"per-user","key":"rl:bench:default/per-user:user=user-0001:60s","limit":1000,"remaining":999,"reset":1}`)
	replyBody = []byte(`{"code":429,"message":"rate limit exceeded","data":{"rule":"per-user","limit":1,"remaining":0,"reset":3600},"timestamp":"2026-11-25T22:01:05Z","trace_id":"`)
	headers   = [][2]string{{"content-type", "application/json"}, {"retry-after", "3600"},
		{"x-ratelimit-limit", "1"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "3600"}}
	scratch = make([]byte, bucketBytes)
	body    = make([]byte, 0, 512)
	sink    int64
)

func init() {
	for i := range keys {
		keys[i] = "callfloor/" + strconv.Itoa(i)
	}
}

type vm struct{ types.DefaultVMContext }

func (*vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct {
	types.DefaultPluginContext
	deny bool
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, _ := proxywasm.GetPluginConfiguration()
	p.deny = string(cfg) == "deny"
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(uint32) types.HttpContext { return &stream{deny: p.deny} }

type stream struct {
	types.DefaultHttpContext
	deny bool
}

func (s *stream) OnHttpRequestHeaders(int, bool) types.Action {
	proxywasm.BeginHostScratch()
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	user, _ := proxywasm.GetHttpRequestHeader("x-user-id")
	now, _ := proxywasm.GetCurrentTimeNanoseconds()
	sink += now + int64(len(path))
	key := keys[fnv1a(user)%buckets]
	value, cas, err := proxywasm.GetSharedData(key)
	if err != nil {
		cas = 0
	}
	if s.deny && err == nil {
		id, _ := proxywasm.GetHttpRequestHeader("x-request-id")
		_ = proxywasm.SetProperty(state, stateJSON)
		b := append(append(append(body[:0], replyBody...), id...), '"', '}')
		_ = proxywasm.SendHttpResponseWithDetails(429, "sluice_rate_limited", headers, b, proxywasm.GrpcStatusNone)
		return types.ActionPause
	}
	copy(scratch, value)
	scratch[0]++
	_ = proxywasm.SetSharedData(key, scratch, cas)
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
