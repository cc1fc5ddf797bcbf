// Command floor is the benchmark floor for the sluice filter: a proxy-wasm
// plugin on the same binding (filter/proxywasm) that reads what sluice's
// request path reads for a one-rule policy keyed on the user — :method,
// :path, the identity headers x-user-id and x-tenant-id, and
// source.address — and continues. The filter's benchmarks run it side by
// side with build/sluice.wasm (filter/bench_test.go builds it):
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o floor.wasm ./filter/testdata/floor
package main

import (
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vm{}) }

func main() {}

type vm struct{ types.DefaultVMContext }

func (*vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct{ types.DefaultPluginContext }

func (*plugin) NewHttpContext(uint32) types.HttpContext { return &stream{} }

type stream struct{ types.DefaultHttpContext }

var sourceAddress = []string{"source", "address"}

// sink keeps the reads from being optimised away.
var sink int

func (*stream) OnHttpRequestHeaders(int, bool) types.Action {
	for _, h := range [...]string{":method", ":path", "x-user-id", "x-tenant-id"} {
		v, _ := proxywasm.GetHttpRequestHeader(h)
		sink += len(v)
	}
	v, _ := proxywasm.GetProperty(sourceAddress)
	sink += len(v)
	return types.ActionContinue
}
