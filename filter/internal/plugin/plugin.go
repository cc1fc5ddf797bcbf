// Package plugin is sluice's proxy-wasm plugin. For now it passes every
// request through unchanged until rate-limit enforcement lands (a later
// issue): its VM context creates plugin contexts whose HTTP contexts
// continue every callback.
//
// Failure policy (STYLE.md): bad configuration will stop the plugin from
// starting; trouble while serving a request is logged, counted, and the
// request passes.
package plugin

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

// NewVMContext returns the VM context to register with
// proxywasm.SetVMContext from init. It makes no hostcall.
func NewVMContext() types.VMContext { return &vmContext{} }

type vmContext struct {
	types.DefaultVMContext
}

// NewPluginContext is called for each root context (one per plugin
// configuration per worker VM, plus the canary).
func (*vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{}
}

type pluginContext struct {
	types.DefaultPluginContext
}

// NewHttpContext is called for each HTTP stream; the pass-through context
// has no state, so this does not allocate.
func (*pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	return &passThrough{}
}

// passThrough continues every HTTP callback (types.DefaultHttpContext).
type passThrough struct {
	types.DefaultHttpContext
}
