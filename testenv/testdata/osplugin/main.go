// Command osplugin is abiplugin's deliberately os-importing twin: it
// prints with fmt (which initialises the Go runtime's poller through os)
// and forces a GC per request. Under a host whose WASI poll_oneoff
// answers ENOSYS (Envoy before proxy-wasm-cpp-host PR #533) it crashes at
// its first GC (golang/go#78513); under PR #533's answer it runs.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o osplugin.wasm ./testenv/testdata/osplugin
package main

import (
	"fmt"
	"runtime"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct{ types.DefaultPluginContext }

func (*pluginContext) NewHttpContext(id uint32) types.HttpContext { return &httpContext{id: id} }

type httpContext struct {
	types.DefaultHttpContext
	id uint32
}

var retained []byte

func (h *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	retained = make([]byte, 64<<10)
	runtime.GC()
	fmt.Println("request", h.id)
	return types.ActionContinue
}
