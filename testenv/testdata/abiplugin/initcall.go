//go:build abi_initcall

package main

import "github.com/sluice-proxy/sluice/filter/proxywasm"

// With -tags abi_initcall, init makes a hostcall Envoy forbids during
// _initialize, so the module must fail to start.
func init() { _, _, _ = proxywasm.GetSharedData("from-init") }
