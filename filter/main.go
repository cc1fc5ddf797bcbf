// Command sluice is the proxy-wasm filter, built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o build/sluice.wasm ./filter
//
// Envoy runs _initialize (package init) and never main; all setup is in
// init and calls no hostcall but proxy_log.
package main

import (
	"github.com/sluice-proxy/sluice/filter/internal/plugin"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

func init() { proxywasm.SetVMContext(plugin.NewVMContext()) }

func main() {}
