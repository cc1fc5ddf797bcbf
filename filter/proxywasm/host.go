package proxywasm

import (
	"math"
	"time"
)

// GetVMConfiguration returns the VM configuration (Envoy:
// vm_config.configuration) with proxy_get_buffer_bytes on buffer 6,
// VM_CONFIGURATION (spec v0.2.1 "proxy_on_vm_start"). Envoy makes the
// buffer readable only during proxy_on_vm_start, i.e. inside
// VMContext.OnVMStart. An empty configuration is (nil, nil).
//
// Errors: ErrNotFound outside OnVMStart; see ErrNotFound for the others.
func GetVMConfiguration() ([]byte, error) {
	return getBuffer(BufferTypeVMConfiguration, 0, math.MaxInt32)
}

// GetPluginConfiguration returns the plugin configuration (Envoy: the
// filter's config.configuration, as raw bytes) with proxy_get_buffer_bytes
// on buffer 7, PLUGIN_CONFIGURATION (spec v0.2.1 "proxy_on_configure").
// Envoy makes it readable only during proxy_on_configure, i.e. inside
// PluginContext.OnPluginStart. An empty configuration is (nil, nil).
//
// Errors: ErrNotFound outside OnPluginStart.
func GetPluginConfiguration() ([]byte, error) {
	return getBuffer(BufferTypePluginConfiguration, 0, math.MaxInt32)
}

// SetTickPeriodMilliSeconds asks the host to call PluginContext.OnTick of the
// current root context every periodMillis milliseconds, with
// proxy_set_tick_period_milliseconds (spec v0.2.1 "Timers"); 0 disables
// ticks. Envoy keys the timer by root context and fires first after one
// period; each worker VM ticks on its own (docs/ENVOY.md, Ticks and worker
// VMs).
func SetTickPeriodMilliSeconds(periodMillis uint32) error {
	return statusError(hostSetTickPeriodMilliseconds(periodMillis))
}

// GetCurrentTimeNanoseconds returns the host's wall-clock time in
// nanoseconds since the Unix epoch, with proxy_get_current_time_nanoseconds
// (spec v0.2.1 "Time"; deprecated in later ABIs, still served by Envoy).
// Prefer it to time.Now so that a test host's clock governs the plugin.
func GetCurrentTimeNanoseconds() (int64, error) {
	t, st := hostGetCurrentTimeNanoseconds()
	if err := statusError(st); err != nil {
		return 0, err
	}
	return int64(t), nil
}

// GetCurrentTime is GetCurrentTimeNanoseconds as a time.Time.
func GetCurrentTime() (time.Time, error) {
	ns, err := GetCurrentTimeNanoseconds()
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns), nil
}

// SetEffectiveContext makes contextID the context that later hostcalls in
// this callback act on, with proxy_set_effective_context (spec v0.2.1
// "Contexts"). Use it in a root context's callbacks (e.g. an HTTP call
// response) to resume or answer a stream; DispatchHttpCall callbacks get it
// done for them. Errors: ErrBadArgument for an unknown context.
func SetEffectiveContext(contextID uint32) error {
	if err := statusError(hostSetEffectiveContext(contextID)); err != nil {
		return err
	}
	activeContextID = contextID
	return nil
}

// PluginDone tells the host that a root context whose OnPluginDone
// returned false has finished, with proxy_done (spec v0.2.1 "Contexts");
// the host then deletes it. Errors: ErrNotFound if no shutdown was pending.
func PluginDone() error {
	return statusError(hostDone())
}

// GetStatus returns the status code and message of the last failed
// operation, with proxy_get_status (spec v0.2.1 "proxy_get_status"). After
// an HTTP call response with numHeaders == 0 Envoy reports code 11
// (BrokenConnection) and message "reset".
func GetStatus() (code uint32, message string, err error) {
	code, msg, st := hostGetStatus()
	if err := statusError(st); err != nil {
		return 0, "", err
	}
	return code, bytesString(msg), nil
}

// getBuffer reads up to maxSize bytes from start of a host buffer with
// proxy_get_buffer_bytes (spec v0.2.1 "Buffers"). The host clamps to the
// buffer's end and answers an empty range with (nil, nil).
func getBuffer(bt BufferType, start, maxSize int) ([]byte, error) {
	s, m, err := bufferRange(start, maxSize)
	if err != nil {
		return nil, err
	}
	b, st := hostGetBufferBytes(bt, s, m)
	if err := statusError(st); err != nil {
		return nil, err
	}
	return b, nil
}

// bufferRange checks start and maxSize (bytes) and converts them to u32,
// clamping maxSize so that start+maxSize fits in 32 bits.
func bufferRange(start, maxSize int) (uint32, uint32, error) {
	if start < 0 || maxSize < 0 || start > math.MaxUint32 {
		return 0, 0, ErrBadArgument
	}
	if maxSize > math.MaxUint32-start {
		maxSize = math.MaxUint32 - start
	}
	return uint32(start), uint32(maxSize), nil
}

// GetBufferStatus returns the size in bytes and the flags of a host
// buffer, with proxy_get_buffer_status (spec v0.2.1 "Buffers").
// Errors: ErrNotFound if the buffer is not available in this callback.
func GetBufferStatus(bt BufferType) (sizeBytes uint32, flags uint32, err error) {
	size, flags, st := hostGetBufferStatus(bt)
	if err := statusError(st); err != nil {
		return 0, 0, err
	}
	return size, flags, nil
}
