package host

import (
	"context"
	"strconv"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// WASI errno values (wasi_snapshot_preview1 "errno").
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoInval   = 28
	errnoNosys   = 52
	errnoNotsup  = 58
)

// maxRandomGet is CPPHOST's PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES.
const maxRandomGet = 64 << 10

// instantiateWASI builds Envoy's WASI surface (CPPHOST src/exports.cc)
// under module name: wazero's functions as a base (whatever Envoy does
// not define fails for lack of a filesystem), with every call a Go guest
// makes replaced by Envoy's behaviour and checked against the restricted
// phases.
func (h *Host) instantiateWASI(ctx context.Context, module string) error {
	b := h.rt.NewHostModuleBuilder(module)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	for _, f := range wasiFunctions() {
		h.defineWASI(b, f)
	}
	h.defineProcExit(b)
	_, err := b.Instantiate(ctx)
	return err
}

// wasiFunc is one WASI function this host defines: its name, parameters and
// what it does, returning an errno.
type wasiFunc struct {
	name   string
	params []api.ValueType
	fn     func(v *vm, s []uint64) uint32
}

// wasiFunctions are the WASI functions a Go guest calls, each as Envoy
// (CPPHOST src/exports.cc) defines it.
func wasiFunctions() []wasiFunc {
	return []wasiFunc{
		{"args_sizes_get", i32s(2), wasiArgsSizesGet},
		{"args_get", i32s(2), wasiArgsGet},
		{"environ_sizes_get", i32s(2), wasiEnvironSizesGet},
		{"environ_get", i32s(2), wasiEnvironGet},
		{"clock_time_get", []api.ValueType{i32, i64, i32}, wasiClockTimeGet},
		{"fd_write", i32s(4), wasiFdWrite},
		{"fd_close", i32s(1), wasiFdClose},
		{"fd_fdstat_get", i32s(2), wasiFdFdstatGet},
		{"fd_fdstat_set_flags", i32s(2), wasiFdFdstatSetFlags},
		{"fd_prestat_get", i32s(2), wasiFdPrestatGet},
		{"fd_prestat_dir_name", i32s(3), wasiFdPrestatDirName},
		{"sched_yield", nil, wasiSchedYield},
		{"random_get", i32s(2), wasiRandomGet},
		{"poll_oneoff", i32s(4), wasiPollOneoff},
	}
}

// defineWASI exports f under its name: counted, checked against the
// restricted phases, traced when Config.Trace is set.
func (h *Host) defineWASI(b wazero.HostModuleBuilder, f wasiFunc) {
	calls := h.calls.counter(f.name)
	trace := h.cfg.Trace
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, s []uint64) {
		calls.Add(1)
		v := vmFrom(ctx)
		if v.mem == nil {
			v.mem = mod.Memory() // during _initialize
		}
		v.trapIfRestricted(f.name)
		e := f.fn(v, s)
		if trace {
			v.trace = append(v.trace, f.name+" -> errno "+strconv.Itoa(int(e)))
		}
		s[0] = uint64(e)
	}), f.params, []api.ValueType{i32}).Export(f.name)
}

// defineProcExit exports proc_exit. CPPHOST only logs it; a Go guest would
// then run on in a dead runtime, so this host traps, which fails the VM as
// the guest's next trap would in Envoy.
func (h *Host) defineProcExit(b wazero.HostModuleBuilder) {
	exitCalls := h.calls.counter("proc_exit")
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, s []uint64) {
		exitCalls.Add(1)
		v := vmFrom(ctx)
		v.log(LogError, "wasi proc_exit("+strconv.Itoa(int(int32(s[0])))+")", "host")
		panic(errTrap{"proc_exit(" + strconv.Itoa(int(int32(s[0]))) + ")"})
	}), i32s(1), nil).Export("proc_exit")
}

// wasiArgsSizesGet is WASI args_sizes_get.
func wasiArgsSizesGet(v *vm, s []uint64) uint32 {
	// CPPHOST: no arguments.
	if !v.writeU32(uint32(s[0]), 0) || !v.writeU32(uint32(s[1]), 0) {
		return errnoInval
	}
	return errnoSuccess
}

// wasiArgsGet is WASI args_get.
func wasiArgsGet(*vm, []uint64) uint32 {
	return errnoSuccess
}

// wasiEnvironSizesGet is WASI environ_sizes_get.
func wasiEnvironSizesGet(v *vm, s []uint64) uint32 {
	// CPPHOST: vm_config.environment_variables.
	n := 0
	for _, e := range v.h.env {
		n += len(e) + 1
	}
	if !v.writeU32(uint32(s[0]), uint32(len(v.h.env))) || !v.writeU32(uint32(s[1]), uint32(n)) {
		return errnoInval
	}
	return errnoSuccess
}

// wasiEnvironGet is WASI environ_get.
func wasiEnvironGet(v *vm, s []uint64) uint32 {
	ptrs, buf := uint32(s[0]), uint32(s[1])
	for i, e := range v.h.env {
		if !v.writeU32(ptrs+4*uint32(i), buf) || !v.mem.Write(buf, append([]byte(e), 0)) {
			return errnoInval
		}
		buf += uint32(len(e) + 1)
	}
	return errnoSuccess
}

// wasiClockTimeGet is WASI clock_time_get.
func wasiClockTimeGet(v *vm, s []uint64) uint32 {
	var t uint64
	switch uint32(s[0]) {
	case 0: // realtime: the Host's clock (virtual in tests).
		t = uint64(v.h.clock.Now().UnixNano())
	case 1: // monotonic: always real, see Clock.
		t = monotonicNanos()
	default:
		return errnoNotsup // CPPHOST: other clocks are NOTSUP.
	}
	if !v.mem.WriteUint64Le(uint32(s[2]), t) {
		return errnoInval
	}
	return errnoSuccess
}

// wasiFdWrite is WASI fd_write.
func wasiFdWrite(v *vm, s []uint64) uint32 {
	// CPPHOST wasi_unstable_fd_write: fd 1 → info log, fd 2 → error log.
	fd := uint32(s[0])
	if fd != 1 && fd != 2 {
		return errnoBadf
	}
	var sb strings.Builder
	iovs, n := uint32(s[1]), uint32(s[2])
	for i := uint32(0); i < n; i++ {
		p, ok1 := v.mem.ReadUint32Le(iovs + 8*i)
		l, ok2 := v.mem.ReadUint32Le(iovs + 8*i + 4)
		data, ok3 := v.read(p, l)
		if !ok1 || !ok2 || !ok3 {
			return errnoInval
		}
		sb.Write(data)
	}
	if !v.writeU32(uint32(s[3]), uint32(sb.Len())) {
		return errnoInval
	}
	lvl, src := LogInfo, "stdout"
	if fd == 2 {
		lvl, src = LogError, "stderr"
	}
	v.log(lvl, strings.TrimSuffix(sb.String(), "\n"), src)
	return errnoSuccess
}

// wasiFdClose is WASI fd_close.
func wasiFdClose(*vm, []uint64) uint32 {
	return errnoNosys
}

// wasiFdFdstatGet is WASI fd_fdstat_get.
func wasiFdFdstatGet(v *vm, s []uint64) uint32 {
	fd := uint32(s[0])
	var st [24]byte
	switch {
	case v.h.profile.StdioCharDevice && fd <= 2:
		st[0] = 2 // CHARACTER_DEVICE
		if fd == 0 {
			st[8] = 2 // FD_READ
		} else {
			st[8] = 64 // FD_WRITE
		}
	case !v.h.profile.StdioCharDevice && (fd == 1 || fd == 2):
		st[8] = 64 // filetype UNKNOWN, rights FD_WRITE (CPPHOST)
	default:
		return errnoBadf
	}
	// fs_flags as the guest last set them: Go's syscall init sets
	// FDFLAG_NONBLOCK on stdio and os.NewFile then makes stdout
	// pollable, initialising the runtime poller — the path that meets
	// an ENOSYS poll_oneoff in golang/go#78513 [UNCONFIRMED that
	// CPPHOST echoes the flags; it is what reproduces the reported
	// Envoy crash].
	st[2] = byte(v.fdFlags[fd])
	if !v.mem.Write(uint32(s[1]), st[:]) {
		return errnoInval
	}
	return errnoSuccess
}

// wasiFdFdstatSetFlags is WASI fd_fdstat_set_flags.
func wasiFdFdstatSetFlags(v *vm, s []uint64) uint32 {
	fd := uint32(s[0])
	if fd > 2 || (fd == 0 && !v.h.profile.StdioCharDevice) {
		return errnoBadf
	}
	v.fdFlags[fd] = uint16(s[1])
	return errnoSuccess
}

// wasiFdPrestatGet is WASI fd_prestat_get.
func wasiFdPrestatGet(*vm, []uint64) uint32 {
	return errnoBadf // no preopens
}

// wasiFdPrestatDirName is WASI fd_prestat_dir_name.
func wasiFdPrestatDirName(*vm, []uint64) uint32 {
	return errnoNosys
}

// wasiSchedYield is WASI sched_yield.
func wasiSchedYield(*vm, []uint64) uint32 {
	return errnoSuccess
}

// wasiRandomGet is WASI random_get.
func wasiRandomGet(v *vm, s []uint64) uint32 {
	n := uint32(s[1])
	if n > maxRandomGet {
		return errnoInval
	}
	buf := make([]byte, n)
	v.h.randRead(buf)
	if !v.mem.Write(uint32(s[0]), buf) {
		return errnoInval
	}
	return errnoSuccess
}

// wasiPollOneoff is WASI poll_oneoff.
func wasiPollOneoff(v *vm, s []uint64) uint32 {
	if v.h.profile.PollOneoffENOSYS {
		return errnoNosys // CPPHOST from PR #427 until PR #533.
	}
	// PR #533: success with zero events, without sleeping.
	if !v.writeU32(uint32(s[3]), 0) {
		return errnoInval
	}
	return errnoSuccess
}
