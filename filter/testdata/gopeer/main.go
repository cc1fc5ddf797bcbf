// Command gopeer is the yardstick for the sluice filter's cost per request:
// a Go rate limiter on the same binding (filter/proxywasm) that does the
// least a Wasm rate limiter with an exact shared counter can do. Per
// request it reads :path and x-user-id and the clock, decides one GCRA
// (the generic cell rate algorithm of ITU-T I.371: a theoretical arrival
// time, TAT, advanced by one emission interval per request, limited when it
// runs more than the burst ahead of now) kept as 8 bytes in shared data under
// "gopeer/<user>", and writes it back by compare-and-swap; a limited
// request gets a 429 local reply. No filter state, no response headers, no
// metrics. It exports what the binding exports, so beside sluice it prices
// sluice's features, and beside a freestanding C limiter of the same shape
// it prices the Go toolchain and the binding.
//
// Plugin configuration: {"limit":N}, N requests a minute per user (burst N).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o gopeer.wasm ./filter/testdata/gopeer
package main

import (
	"encoding/binary"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vm{}) }

func main() {}

const (
	keyPrefix = "gopeer/"
	maxUser   = 200 // longer user values are not counted
	casTries  = 8
)

var (
	intervalNs   int64 = 60e9 / 3 // one request's advance of the TAT
	burstNs      int64 = 2 * 60e9 / 3
	key                = make([]byte, 0, len(keyPrefix)+maxUser)
	tatBytes           = make([]byte, 8)
	replyBody          = []byte(`{"code":429,"message":"rate limit exceeded"}`)
	replyHeaders       = [][2]string{{"content-type", "application/json"}}
)

type vm struct{ types.DefaultVMContext }

func (*vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct{ types.DefaultPluginContext }

// OnPluginStart reads {"limit":N}: the digits after `"limit":`.
func (*plugin) OnPluginStart(size int) types.OnPluginStartStatus {
	if size == 0 {
		return types.OnPluginStartStatusOK
	}
	c, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		return types.OnPluginStartStatusFailed
	}
	const field = `"limit":`
	var n int64
	for i := 0; i+len(field) <= len(c); i++ {
		if string(c[i:i+len(field)]) != field {
			continue
		}
		for _, d := range c[i+len(field):] {
			if d < '0' || d > '9' {
				break
			}
			n = n*10 + int64(d-'0')
		}
		break
	}
	if n > 0 {
		intervalNs = max(60e9/n, 1)
		burstNs = (n - 1) * intervalNs
	}
	return types.OnPluginStartStatusOK
}

var theStream stream

// NewHttpContext returns one stream record for every stream: the record
// holds nothing between callbacks.
func (*plugin) NewHttpContext(uint32) types.HttpContext { return &theStream }

type stream struct{ types.DefaultHttpContext }

func (*stream) OnHttpRequestHeaders(int, bool) types.Action {
	proxywasm.BeginHostScratch()
	_, _ = proxywasm.GetHttpRequestHeader(":path")
	user, err := proxywasm.GetHttpRequestHeader("x-user-id")
	if err != nil || len(user) == 0 || len(user) > maxUser {
		return types.ActionContinue
	}
	now, err := proxywasm.GetCurrentTimeNanoseconds()
	if err != nil {
		return types.ActionContinue
	}
	key = append(append(key[:0], keyPrefix...), user...)
	k := string(key) // one allocation; the binding takes a string key
	for range casTries {
		var tat int64
		v, cas, err := proxywasm.GetSharedData(k)
		if err == nil && len(v) == 8 {
			tat = int64(binary.LittleEndian.Uint64(v))
		}
		tat = max(tat, int64(now))
		if tat-int64(now) > burstNs {
			_ = proxywasm.SendHttpResponse(429, replyHeaders, replyBody, -1)
			return types.ActionPause
		}
		binary.LittleEndian.PutUint64(tatBytes, uint64(tat+intervalNs))
		if proxywasm.SetSharedData(k, tatBytes, cas) == nil {
			return types.ActionContinue
		}
	}
	return types.ActionContinue
}
