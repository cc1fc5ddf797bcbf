package host

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// phase restricts which hostcalls a VM may make (CPPHOST
// WasmVm::setRestrictedCallback).
type phase uint8

const (
	phaseNormal phase = iota
	// phaseStart: _initialize and main. CPPHOST WasmBase::startVm allows
	// env.proxy_log plus the WASI calls below.
	phaseStart
	// phaseAlloc: the guest allocator. CPPHOST WasmBase::allocMemory
	// allows env.proxy_log, fd_write, clock_time_get (and poll_oneoff
	// since PR #533, see Profile.PollOneoffInAllocator).
	phaseAlloc
)

// startAllowed is CPPHOST src/wasm.cc WasmBase::startVm's allow-list. The
// calls PR #427 added for Go (fd_fdstat_get, fd_fdstat_set_flags,
// sched_yield, poll_oneoff) are allowed too: Go's _initialize calls them
// when os is imported and guests were reported to load on Envoy 1.33
// [UNCONFIRMED which list PR #427 extended].
var startAllowed = map[string]bool{
	"env.proxy_log": true, "fd_write": true, "args_sizes_get": true, "args_get": true,
	"environ_sizes_get": true, "environ_get": true, "fd_prestat_get": true,
	"fd_prestat_dir_name": true, "clock_time_get": true, "random_get": true,
	"fd_fdstat_get": true, "fd_fdstat_set_flags": true, "sched_yield": true, "poll_oneoff": true,
}

var allocAllowed = map[string]bool{"env.proxy_log": true, "fd_write": true, "clock_time_get": true}

type vmKey struct{}

// vm is one module instance with its event loop. Fields below "loop
// state" are touched only on the loop goroutine.
type vm struct {
	h     *Host
	index int // -1: canary
	name  string
	ctx   context.Context // carries vmKey → *vm into host functions
	mod   api.Module
	mem   api.Memory
	fns   map[string]api.Function
	alloc api.Function

	qmu    sync.Mutex
	queue  []func()
	wake   chan struct{}
	closed bool
	done   chan struct{}

	// loop state
	phase         phase
	failed        error
	nextContextID uint32
	rootID        uint32
	current       uint32 // context of the running top-level call
	callName      string // name of the running top-level call
	effective     uint32 // after proxy_set_effective_context
	streams       map[uint32]*stream
	afterCall     []func()
	forceStop     bool
	readVMConfig  bool
	readPlugin    bool
	callout       *calloutResult // during proxy_on_http_call_response
	status        struct {
		code uint32
		msg  string
	}
	nextCallToken uint32
	calls         map[uint32]struct{}
	metricIDs     map[uint32]*metric
	nextMetricID  [3]uint32
	tickPeriodMS  uint32
	tickGen       uint64
	tickStop      func() bool
	pendingDone   bool
	trace         []string
	stack         []uint64
	fdFlags       [3]uint16 // WASI fs_flags of stdio
	// inlineCalls counts Config.InlineCallouts calls not yet delivered; on the loop.
	inlineCalls int
}

// startVM instantiates the module as worker index (-1: canary) and runs
// Envoy's start sequence on the new VM's loop.
func (h *Host) startVM(ctx context.Context, index int) (*vm, error) {
	v := &vm{
		h: h, index: index, wake: make(chan struct{}, 1), done: make(chan struct{}),
		nextContextID: 1, streams: map[uint32]*stream{}, calls: map[uint32]struct{}{},
		metricIDs: map[uint32]*metric{}, nextMetricID: [3]uint32{0, 1, 2}, nextCallToken: 1,
		stack: make([]uint64, 8),
	}
	if index < 0 {
		v.name = "canary"
	} else {
		v.name = "worker-" + strconv.Itoa(index)
	}
	v.ctx = context.WithValue(context.Background(), vmKey{}, v)
	go v.loop()
	err := v.run(ctx, func() error { return v.start() })
	if err != nil {
		v.close()
		return nil, err
	}
	return v, nil
}

func vmFrom(ctx context.Context) *vm { return ctx.Value(vmKey{}).(*vm) }

func (v *vm) start() error {
	h := v.h
	start := "_initialize"
	if _, ok := h.exports[start]; !ok {
		if _, ok := h.exports["_start"]; ok {
			start = "_start" // WASI command (CPPHOST startVm).
		} else {
			start = ""
		}
	}
	cfg := wazero.NewModuleConfig().WithName(v.name).
		WithSysWalltime().WithSysNanotime().WithSysNanosleep().
		WithRandSource(randReader{v.h})
	if start != "" {
		cfg = cfg.WithStartFunctions(start)
	} else {
		cfg = cfg.WithStartFunctions()
	}
	v.phase = phaseStart
	mod, err := h.rt.InstantiateModule(v.ctx, h.compiled, cfg)
	if err != nil {
		v.phase = phaseNormal
		v.failed = &TrapError{Worker: v.index, Call: start, Err: err}
		return v.failed
	}
	v.mod, v.mem = mod, mod.Memory()
	v.fns = map[string]api.Function{}
	for name := range h.exports {
		v.fns[name] = mod.ExportedFunction(name)
	}
	if start == "_initialize" {
		// CPPHOST: main(0, 0) (or __main_void) after _initialize.
		for _, m := range []string{"main", "__main_void"} {
			if f := v.fns[m]; f != nil {
				var err error
				if m == "main" {
					_, err = f.Call(v.ctx, 0, 0)
				} else {
					_, err = f.Call(v.ctx)
				}
				if err != nil {
					v.phase = phaseNormal
					v.failed = &TrapError{Worker: v.index, Call: m, Err: err}
					return v.failed
				}
				break
			}
		}
	}
	v.phase = phaseNormal
	// CPPHOST getFunctions: malloc is preferred over proxy_on_memory_allocate.
	v.alloc = v.fns[v.h.allocName]
	if v.alloc == nil {
		v.failed = fmt.Errorf("host: %s: missing malloc function (neither malloc nor proxy_on_memory_allocate is exported)", v.name)
		return v.failed
	}
	// Root context: on_context_create(root, 0), on_vm_start, on_configure
	// (CPPHOST ContextBase::onStart/onConfigure).
	v.rootID = v.allocContextID()
	if _, err := v.callback("proxy_on_context_create", uint64(v.rootID), 0); err != nil {
		return err
	}
	v.readVMConfig = true
	ok, err := v.callback("proxy_on_vm_start", uint64(v.rootID), uint64(len(h.cfg.VMConfig)))
	v.readVMConfig = false
	if err != nil {
		return err
	}
	if v.fns["proxy_on_vm_start"] != nil && uint32(ok) == 0 {
		return fmt.Errorf("host: %s: plugin %q: %w (Envoy: Failed to start base Wasm)", v.name, h.cfg.PluginName, ErrStartFailed)
	}
	v.readPlugin = true
	ok, err = v.callback("proxy_on_configure", uint64(v.rootID), uint64(len(h.cfg.PluginConfig)))
	v.readPlugin = false
	if err != nil {
		return err
	}
	if v.fns["proxy_on_configure"] != nil && uint32(ok) == 0 {
		return fmt.Errorf("host: %s: plugin %q: %w (Envoy: Failed to configure base Wasm plugin)", v.name, h.cfg.PluginName, ErrConfigureFailed)
	}
	return nil
}

type randReader struct{ h *Host }

func (r randReader) Read(b []byte) (int, error) { r.h.randRead(b); return len(b), nil }

func (v *vm) allocContextID() uint32 {
	id := v.nextContextID
	v.nextContextID++
	return id
}

// loop runs posted tasks one at a time until close.
func (v *vm) loop() {
	defer close(v.done)
	for {
		v.qmu.Lock()
		for len(v.queue) == 0 && !v.closed {
			v.qmu.Unlock()
			<-v.wake
			v.qmu.Lock()
		}
		if len(v.queue) == 0 && v.closed {
			v.qmu.Unlock()
			return
		}
		f := v.queue[0]
		v.queue[0] = nil
		v.queue = v.queue[1:]
		v.qmu.Unlock()
		f()
	}
}

// post queues f on the loop without waiting; it reports false if the VM
// is closed. It may be called from the loop itself.
func (v *vm) post(f func()) bool {
	v.qmu.Lock()
	if v.closed {
		v.qmu.Unlock()
		return false
	}
	v.queue = append(v.queue, f)
	v.qmu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
	return true
}

// run executes f on the loop and waits for it. ctx only bounds the wait
// for the result; f itself always runs to completion.
func (v *vm) run(ctx context.Context, f func() error) error {
	res := make(chan error, 1)
	if !v.post(func() { res <- f() }) {
		return ErrClosed
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close stops the loop after the tasks already queued and frees the
// module. Safe to call more than once.
func (v *vm) close() {
	v.qmu.Lock()
	already := v.closed
	v.closed = true
	v.qmu.Unlock()
	if already {
		return
	}
	select {
	case v.wake <- struct{}{}:
	default:
	}
	<-v.done
	if v.tickStop != nil {
		v.tickStop()
	}
	if v.mod != nil {
		v.mod.Close(context.Background())
	}
}

// shutdown runs proxy_on_done / proxy_on_delete on the root context
// (CPPHOST WasmBase::startShutdown); a root context answering false stays
// pending until it calls proxy_done.
func (v *vm) shutdown() {
	_ = v.run(context.Background(), func() error {
		v.stopTick()
		if v.failed != nil || v.mod == nil {
			return nil
		}
		r, err := v.callback("proxy_on_done", uint64(v.rootID))
		if err != nil {
			return err
		}
		if v.fns["proxy_on_done"] == nil || uint32(r) != 0 {
			_, err = v.callback("proxy_on_delete", uint64(v.rootID))
			return err
		}
		v.pendingDone = true
		return nil
	})
}

// callback calls an optional export with ctxID = args[0] as the current
// context, then runs the deferred "after VM call" actions (CPPHOST
// WasmBase::doAfterVmCallActions). A missing export returns 0. A trap
// fails the VM.
func (v *vm) callback(name string, args ...uint64) (uint64, error) {
	return v.call(name, nil, args...)
}

// call is callback with onReturn run on the result before the after-call
// actions, so a phase can record PAUSE before a deferred continue_stream
// resumes it.
func (v *vm) call(name string, onReturn func(uint64), args ...uint64) (uint64, error) {
	if v.failed != nil {
		return 0, v.failed
	}
	f := v.fns[name]
	if f == nil {
		if onReturn != nil {
			onReturn(0)
		}
		return 0, nil
	}
	v.forceStop = false
	v.h.entries[name].Add(1)
	if v.h.cfg.Trace {
		v.traceCall(name, args)
	}
	prevCur, prevEff, prevName := v.current, v.effective, v.callName
	v.callName = name
	if len(args) > 0 {
		v.current, v.effective = uint32(args[0]), uint32(args[0])
	}
	if name == "proxy_on_http_call_response" || name == "proxy_on_queue_ready" || name == "proxy_on_tick" {
		v.current, v.effective = v.rootID, v.rootID
	}
	stack := v.stack[:0]
	stack = append(stack, args...)
	if n := len(f.Definition().ResultTypes()); len(stack) < n {
		stack = append(stack, make([]uint64, n-len(stack))...)
	}
	err := f.CallWithStack(v.ctx, stack)
	v.current, v.effective, v.callName = prevCur, prevEff, prevName
	if err != nil {
		v.afterCall = nil
		v.failed = &TrapError{Worker: v.index, Call: name, Err: err}
		v.h.addLog(LogEntry{Worker: v.index, ContextID: v.current, Level: LogCritical,
			Message: "Plugin Crash: " + v.failed.Error()}, "host")
		return 0, v.failed
	}
	var r uint64
	if len(f.Definition().ResultTypes()) > 0 {
		r = stack[0]
	}
	if onReturn != nil {
		onReturn(r)
	}
	v.runAfterCall()
	return r, nil
}

func (v *vm) runAfterCall() {
	for len(v.afterCall) > 0 {
		f := v.afterCall[0]
		v.afterCall = v.afterCall[1:]
		f()
	}
}

// errTrap is the panic value host functions use to trap the guest.
type errTrap struct{ msg string }

func (e errTrap) Error() string { return e.msg }

// trapIfRestricted traps with CPPHOST's "restricted_callback" when name
// (e.g. "env.proxy_get_property" or a bare WASI name) is not allowed in
// the VM's current phase.
func (v *vm) trapIfRestricted(name string) {
	switch v.phase {
	case phaseStart:
		if !startAllowed[name] {
			panic(errTrap{"restricted_callback: " + name + " called during " + v.startName()})
		}
	case phaseAlloc:
		if !allocAllowed[name] && !(name == "poll_oneoff" && v.h.profile.PollOneoffInAllocator) {
			panic(errTrap{"restricted_callback: " + name + " called inside the guest allocator"})
		}
	}
}

func (v *vm) startName() string {
	if _, ok := v.h.exports["_initialize"]; ok {
		return "_initialize"
	}
	return "_start"
}

// --- guest memory ---

func (v *vm) read(ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	return v.mem.Read(ptr, size)
}

func (v *vm) readString(ptr, size uint32) (string, bool) {
	b, ok := v.read(ptr, size)
	return string(b), ok
}

func (v *vm) writeU32(ptr, val uint32) bool { return v.mem.WriteUint32Le(ptr, val) }

// copyOut hands data to the guest the way CPPHOST copyToPointerSize does:
// one allocation through the guest allocator (none for empty data: ptr 0,
// size 0), then 32-bit little-endian pointer and size.
func (v *vm) copyOut(data []byte, ptrPtr, sizePtr uint32) status {
	var ptr uint32
	if len(data) > 0 {
		p, err := v.allocate(uint32(len(data)))
		if err != nil {
			panic(err) // a trap inside the allocator fails the VM
		}
		if p == 0 || !v.mem.Write(p, data) {
			return statusInvalidMemoryAccess
		}
		ptr = p
	}
	if !v.writeU32(ptrPtr, ptr) || !v.writeU32(sizePtr, uint32(len(data))) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func (v *vm) allocate(size uint32) (uint32, error) {
	prev := v.phase
	v.phase = phaseAlloc
	defer func() { v.phase = prev }()
	v.h.entries[v.h.allocName].Add(1)
	if v.h.cfg.Trace {
		v.trace = append(v.trace, v.alloc.Definition().Name()+"("+strconv.FormatUint(uint64(size), 10)+")")
	}
	var st [1]uint64
	st[0] = uint64(size)
	if err := v.alloc.CallWithStack(v.ctx, st[:]); err != nil {
		return 0, err
	}
	return uint32(st[0]), nil
}

func (v *vm) traceCall(name string, args []uint64) {
	var b []byte
	b = append(b, name...)
	b = append(b, '(')
	for i, a := range args {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, uint64(uint32(a)), 10)
	}
	b = append(b, ')')
	v.trace = append(v.trace, string(b))
}
