package plugin

import (
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func TestPassThroughContinuesEverything(t *testing.T) {
	vm := NewVMContext()
	if vm.OnVMStart(0) != types.OnVMStartStatusOK {
		t.Fatal("OnVMStart failed")
	}
	p := vm.NewPluginContext(1)
	if p.OnPluginStart(0) != types.OnPluginStartStatusOK {
		t.Fatal("OnPluginStart failed")
	}
	h := p.NewHttpContext(2)
	if h == nil {
		t.Fatal("NewHttpContext returned nil: Envoy streams would get no context")
	}
	for name, a := range map[string]types.Action{
		"request headers":   h.OnHttpRequestHeaders(3, false),
		"request body":      h.OnHttpRequestBody(10, true),
		"request trailers":  h.OnHttpRequestTrailers(1),
		"response headers":  h.OnHttpResponseHeaders(3, false),
		"response body":     h.OnHttpResponseBody(10, true),
		"response trailers": h.OnHttpResponseTrailers(1),
	} {
		if a != types.ActionContinue {
			t.Errorf("%s: action %d, want continue", name, a)
		}
	}
	if tc := p.NewTcpContext(3); tc != nil {
		t.Error("pass-through plugin created a TCP context")
	}
}
