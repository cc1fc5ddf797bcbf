package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

type signature struct{ params, results []api.ValueType }

func sig(params []api.ValueType, results ...api.ValueType) signature {
	return signature{params, results}
}

func n32(n int) []api.ValueType {
	v := make([]api.ValueType, n)
	for i := range v {
		v[i] = i32
	}
	return v
}

// wantExports are the module's function exports with their proxy-wasm ABI
// v0.2.1 signatures (the spec, and proxy-wasm-cpp-host
// include/proxy-wasm/wasm.h), plus the reactor entry. No body, trailer or
// TCP callback: the filter passes bodies untouched, and a callback the
// module does not export is answered Continue by the host without entering
// it, so a request with a body costs no call into Go per chunk. No
// proxy_on_log or proxy_on_done either: a stream's end and a root's
// shutdown run from proxy_on_delete, which the host sends to every context
// (filter/proxywasm/abi_exports_wasip1.go), so each stream enters Go two
// times fewer.
var wantExports = map[string]signature{
	"_initialize":                 sig(nil),
	"proxy_abi_version_0_2_1":     sig(nil),
	"proxy_on_memory_allocate":    sig(n32(1), i32),
	"proxy_on_context_create":     sig(n32(2)),
	"proxy_on_vm_start":           sig(n32(2), i32),
	"proxy_on_configure":          sig(n32(2), i32),
	"proxy_on_tick":               sig(n32(1)),
	"proxy_on_queue_ready":        sig(n32(2)),
	"proxy_on_request_headers":    sig(n32(3), i32),
	"proxy_on_response_headers":   sig(n32(3), i32),
	"proxy_on_http_call_response": sig(n32(5)),
	"proxy_on_delete":             sig(n32(1)),
}

// envImports are the v0.2.1 host functions (§1.2) the module may import.
var envImports = map[string]signature{
	"proxy_log":                          sig(n32(3), i32),
	"proxy_get_log_level":                sig(n32(1), i32),
	"proxy_get_current_time_nanoseconds": sig(n32(1), i32),
	"proxy_set_tick_period_milliseconds": sig(n32(1), i32),
	"proxy_get_buffer_bytes":             sig(n32(5), i32),
	"proxy_set_buffer_bytes":             sig(n32(5), i32),
	"proxy_get_buffer_status":            sig(n32(3), i32),
	"proxy_get_header_map_size":          sig(n32(2), i32),
	"proxy_get_header_map_pairs":         sig(n32(3), i32),
	"proxy_set_header_map_pairs":         sig(n32(3), i32),
	"proxy_get_header_map_value":         sig(n32(5), i32),
	"proxy_add_header_map_value":         sig(n32(5), i32),
	"proxy_replace_header_map_value":     sig(n32(5), i32),
	"proxy_remove_header_map_value":      sig(n32(3), i32),
	"proxy_continue_stream":              sig(n32(1), i32),
	"proxy_close_stream":                 sig(n32(1), i32),
	"proxy_get_status":                   sig(n32(3), i32),
	"proxy_send_local_response":          sig(n32(8), i32),
	"proxy_http_call":                    sig(n32(10), i32),
	"proxy_set_shared_data":              sig(n32(5), i32),
	"proxy_get_shared_data":              sig(n32(5), i32),
	"proxy_register_shared_queue":        sig(n32(3), i32),
	"proxy_resolve_shared_queue":         sig(n32(5), i32),
	"proxy_enqueue_shared_queue":         sig(n32(3), i32),
	"proxy_dequeue_shared_queue":         sig(n32(3), i32),
	"proxy_define_metric":                sig(n32(4), i32),
	"proxy_increment_metric":             sig([]api.ValueType{i32, i64}, i32),
	"proxy_record_metric":                sig([]api.ValueType{i32, i64}, i32),
	"proxy_get_metric":                   sig(n32(2), i32),
	"proxy_get_property":                 sig(n32(4), i32),
	"proxy_set_property":                 sig(n32(4), i32),
	"proxy_set_effective_context":        sig(n32(1), i32),
	"proxy_done":                         sig(nil, i32),
}

// wasiImports is the WASI surface Envoy's host provides that a Go 1.24+
// reactor may use (proxy-wasm-cpp-host src/exports.cc; docs/ENVOY.md, WASI
// and the poll_oneoff crash).
var wasiImports = map[string]bool{
	"args_get": true, "args_sizes_get": true, "clock_time_get": true, "environ_get": true,
	"environ_sizes_get": true, "fd_fdstat_get": true, "fd_fdstat_set_flags": true,
	"fd_prestat_dir_name": true, "fd_prestat_get": true, "fd_write": true, "poll_oneoff": true,
	"proc_exit": true, "random_get": true, "sched_yield": true,
	// Not path_open, fd_read, fd_seek or fd_close: time.LoadLocation would
	// import them to look for zoneinfo files, and shared/rules reads its
	// zones from the module instead (rules.LoadZone).
}

// TestWasmModuleABI builds the filter as Envoy loads it and checks, with
// wazero's decoder, that it exports exactly the v0.2.1 callbacks with the
// right signatures, and imports only v0.2.1 host functions and Envoy's
// WASI functions.
func TestWasmModuleABI(t *testing.T) {
	bin := buildWasm(t)
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	mod, err := r.CompileModule(ctx, bin)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}

	got := map[string]signature{}
	for name, def := range mod.ExportedFunctions() {
		got[name] = sig(def.ParamTypes(), def.ResultTypes()...)
	}
	for name, want := range wantExports {
		g, ok := got[name]
		if !ok {
			t.Errorf("missing export %s", name)
			continue
		}
		if !sameSig(g, want) {
			t.Errorf("export %s: signature %v, want %v", name, g, want)
		}
	}
	for name := range got {
		if _, ok := wantExports[name]; !ok {
			t.Errorf("unexpected export %s", name)
		}
	}
	if _, ok := mod.ExportedMemories()["memory"]; !ok {
		t.Error("memory is not exported")
	}

	var envNames []string
	for _, def := range mod.ImportedFunctions() {
		module, name, _ := def.Import()
		switch module {
		case "env":
			envNames = append(envNames, name)
			want, ok := envImports[name]
			if !ok {
				t.Errorf("import env.%s is not a proxy-wasm v0.2.1 host function", name)
			} else if g := sig(def.ParamTypes(), def.ResultTypes()...); !sameSig(g, want) {
				t.Errorf("import env.%s: signature %v, want %v", name, g, want)
			}
		case "wasi_snapshot_preview1":
			if !wasiImports[name] {
				t.Errorf("import wasi_snapshot_preview1.%s is outside Envoy's WASI surface", name)
			}
		default:
			t.Errorf("import from unexpected module %s.%s", module, name)
		}
	}
	t.Logf("env imports: %v", envNames)
	if !strings.Contains(","+strings.Join(envNames, ",")+",", ",proxy_log,") {
		t.Errorf("env imports %v lack proxy_log", envNames)
	}
}

var wasmBin []byte

// buildWasm builds the filter as `make wasm` does, once per test binary.
func buildWasm(t *testing.T) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the wasm module")
	}
	if wasmBin == nil {
		wasmBin = mustBuild(t)
	}
	return wasmBin
}

// mustBuild builds the filter with -buildmode=c-shared into a temporary
// directory and returns the module.
func mustBuild(tb testing.TB) []byte {
	tb.Helper()
	wasmPath := filepath.Join(tb.TempDir(), "sluice.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasmPath, ".")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(wasmPath)
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// TestWasmPassThroughLifecycle runs the module on wazero through Envoy's
// start sequence and one HTTP stream, with a minimal env module that
// records which hostcalls happen and answers NOT_FOUND to most: without
// configuration the filter has no policy and lets the request through. The real host (testenv) tests far more;
// this pins that the exports dispatch and that _initialize calls nothing.
func TestWasmPassThroughLifecycle(t *testing.T) {
	bin := buildWasm(t)
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)

	var calls []string
	env := r.NewHostModuleBuilder("env")
	env.NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, level, ptr, size uint32) uint32 {
		msg, _ := m.Memory().Read(ptr, size)
		calls = append(calls, "proxy_log "+string(msg))
		return 0
	}).Export("proxy_log")
	env.NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, ret uint32) uint32 {
		calls = append(calls, "proxy_get_log_level")
		m.Memory().WriteUint32Le(ret, 2)
		return 0
	}).Export("proxy_get_log_level")
	env.NewFunctionBuilder().WithFunc(func(_ context.Context, id uint32) uint32 {
		calls = append(calls, "proxy_set_effective_context")
		return 0
	}).Export("proxy_set_effective_context")
	// Every other v0.2.1 import answers NOT_FOUND (1) and is recorded: the
	// plugin then runs without configuration, policy or shared data.
	for name, s := range envImports {
		switch name {
		case "proxy_log", "proxy_get_log_level", "proxy_set_effective_context":
			continue
		}
		name := name
		env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			calls = append(calls, name)
			stack[0] = 1
		}), s.params, s.results).Export(name)
	}
	if _, err := env.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := wazero.NewModuleConfig().WithStartFunctions("_initialize").
		WithSysNanotime().WithSysWalltime().WithSysNanosleep()
	mod, err := r.InstantiateWithConfig(ctx, bin, cfg)
	if err != nil {
		t.Fatalf("instantiate (runs _initialize): %v", err)
	}
	if len(calls) != 0 {
		t.Fatalf("_initialize made hostcalls %q; Envoy allows only proxy_log and this plugin logs nothing", calls)
	}

	call := func(name string, want int64, args ...uint64) {
		t.Helper()
		res, err := mod.ExportedFunction(name).Call(ctx, args...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want >= 0 && (len(res) != 1 || int64(res[0]) != want) {
			t.Fatalf("%s = %v, want %d", name, res, want)
		}
	}
	const void = -1
	call("proxy_on_context_create", void, 1, 0)
	call("proxy_on_vm_start", 1, 1, 0)
	call("proxy_on_configure", 1, 1, 0)
	call("proxy_on_context_create", void, 2, 1)
	call("proxy_on_request_headers", 0, 2, 3, 0)
	call("proxy_on_response_headers", 0, 2, 4, 1)
	call("proxy_on_delete", void, 2)
	for _, size := range []uint64{0, 1, 64 << 10} {
		res, err := mod.ExportedFunction("proxy_on_memory_allocate").Call(ctx, size)
		if err != nil || len(res) != 1 || res[0] == 0 {
			t.Fatalf("proxy_on_memory_allocate(%d) = %v, %v", size, res, err)
		}
		if size > 0 {
			if _, ok := mod.Memory().Read(uint32(res[0]), uint32(size)); !ok {
				t.Fatalf("allocation of %d bytes at %d is outside memory", size, res[0])
			}
		}
	}
	for _, c := range calls {
		if strings.HasPrefix(c, "proxy_send_local_response") {
			t.Fatalf("hostcalls %q: the filter denied a request without a policy (fail_mode open)", calls)
		}
	}
}

func sameSig(a, b signature) bool {
	return reflect.DeepEqual(norm(a.params), norm(b.params)) && reflect.DeepEqual(norm(a.results), norm(b.results))
}

func norm(v []api.ValueType) []api.ValueType {
	if len(v) == 0 {
		return nil
	}
	return v
}
