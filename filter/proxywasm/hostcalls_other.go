//go:build !wasip1

package proxywasm

import "unsafe"

// Outside the wasm build there is no host: every hostcall goes to host,
// which answers UNIMPLEMENTED (status 12) unless a test installs a fake.
// The functions mirror hostcalls_wasip1.go one for one.

// hostAPI is the typed hostcall surface. A result that a real host would
// copy into a buffer from proxy_on_memory_allocate may be a view of the
// host's own storage, valid until the host's next call: the wrappers below
// copy it into a buffer from allocate and claim it with takeAlloc, as the
// wasm build does, so that native runs take the same allocation path
// (arena or fresh buffer) as the .wasm.
type hostAPI interface {
	log(level LogLevel, msg string) status
	getLogLevel() (LogLevel, status)
	getCurrentTimeNanoseconds() (uint64, status)
	setTickPeriodMilliseconds(periodMillis uint32) status
	getBufferBytes(bt BufferType, start, maxSize uint32) ([]byte, status)
	setBufferBytes(bt BufferType, start, size uint32, value []byte) status
	getBufferStatus(bt BufferType) (size, flags uint32, st status)
	getHeaderMapSize(mt MapType) (uint32, status)
	getHeaderMapPairs(mt MapType) ([]byte, status)
	setHeaderMapPairs(mt MapType, data []byte) status
	getHeaderMapValue(mt MapType, key string) ([]byte, status)
	addHeaderMapValue(mt MapType, key, value string) status
	replaceHeaderMapValue(mt MapType, key, value string) status
	removeHeaderMapValue(mt MapType, key string) status
	continueStream(st StreamType) status
	closeStream(st StreamType) status
	getStatus() (code uint32, msg []byte, st status)
	sendLocalResponse(statusCode uint32, details string, body, headers []byte, grpcStatus int32) status
	httpCall(upstream string, headers, body, trailers []byte, timeoutMillis uint32) (uint32, status)
	setSharedData(key string, value []byte, cas uint32) status
	getSharedData(key string) ([]byte, uint32, status)
	registerSharedQueue(name string) (uint32, status)
	resolveSharedQueue(vmID, name string) (uint32, status)
	enqueueSharedQueue(queueID uint32, value []byte) status
	dequeueSharedQueue(queueID uint32) ([]byte, status)
	defineMetric(mt MetricType, name string) (uint32, status)
	incrementMetric(id uint32, delta int64) status
	recordMetric(id uint32, value uint64) status
	getMetric(id uint32) (uint64, status)
	getProperty(path []byte) ([]byte, status)
	setProperty(path, value []byte) status
	setEffectiveContext(contextID uint32) status
	done() status
}

// host is the hostcall target of native builds.
var host hostAPI = unimplementedHost{}

// unimplementedHost answers every call with UNIMPLEMENTED. Test fakes embed
// it and override what they need.
type unimplementedHost struct{}

const unimpl = statusUnimplemented

func (unimplementedHost) log(LogLevel, string) status                 { return unimpl }
func (unimplementedHost) getLogLevel() (LogLevel, status)             { return 0, unimpl }
func (unimplementedHost) getCurrentTimeNanoseconds() (uint64, status) { return 0, unimpl }
func (unimplementedHost) setTickPeriodMilliseconds(uint32) status     { return unimpl }
func (unimplementedHost) getBufferBytes(BufferType, uint32, uint32) ([]byte, status) {
	return nil, unimpl
}
func (unimplementedHost) setBufferBytes(BufferType, uint32, uint32, []byte) status { return unimpl }
func (unimplementedHost) getBufferStatus(BufferType) (uint32, uint32, status) {
	return 0, 0, unimpl
}
func (unimplementedHost) getHeaderMapSize(MapType) (uint32, status)          { return 0, unimpl }
func (unimplementedHost) getHeaderMapPairs(MapType) ([]byte, status)         { return nil, unimpl }
func (unimplementedHost) setHeaderMapPairs(MapType, []byte) status           { return unimpl }
func (unimplementedHost) getHeaderMapValue(MapType, string) ([]byte, status) { return nil, unimpl }
func (unimplementedHost) addHeaderMapValue(MapType, string, string) status   { return unimpl }
func (unimplementedHost) replaceHeaderMapValue(MapType, string, string) status {
	return unimpl
}
func (unimplementedHost) removeHeaderMapValue(MapType, string) status { return unimpl }
func (unimplementedHost) continueStream(StreamType) status            { return unimpl }
func (unimplementedHost) closeStream(StreamType) status               { return unimpl }
func (unimplementedHost) getStatus() (uint32, []byte, status)         { return 0, nil, unimpl }
func (unimplementedHost) sendLocalResponse(uint32, string, []byte, []byte, int32) status {
	return unimpl
}
func (unimplementedHost) httpCall(string, []byte, []byte, []byte, uint32) (uint32, status) {
	return 0, unimpl
}
func (unimplementedHost) setSharedData(string, []byte, uint32) status { return unimpl }
func (unimplementedHost) getSharedData(string) ([]byte, uint32, status) {
	return nil, 0, unimpl
}
func (unimplementedHost) registerSharedQueue(string) (uint32, status)        { return 0, unimpl }
func (unimplementedHost) resolveSharedQueue(string, string) (uint32, status) { return 0, unimpl }
func (unimplementedHost) enqueueSharedQueue(uint32, []byte) status           { return unimpl }
func (unimplementedHost) dequeueSharedQueue(uint32) ([]byte, status)         { return nil, unimpl }
func (unimplementedHost) defineMetric(MetricType, string) (uint32, status)   { return 0, unimpl }
func (unimplementedHost) incrementMetric(uint32, int64) status               { return unimpl }
func (unimplementedHost) recordMetric(uint32, uint64) status                 { return unimpl }
func (unimplementedHost) getMetric(uint32) (uint64, status)                  { return 0, unimpl }
func (unimplementedHost) getProperty([]byte) ([]byte, status)                { return nil, unimpl }
func (unimplementedHost) setProperty([]byte, []byte) status                  { return unimpl }
func (unimplementedHost) setEffectiveContext(uint32) status                  { return unimpl }
func (unimplementedHost) done() status                                       { return unimpl }

// copyResult plays the host's side of proxy_on_memory_allocate for a result
// the native host answered with st and v: like proxy-wasm-cpp-host
// WasmBase::copyToPointerSize it allocates only for a non-empty result,
// copies v into the guest buffer and writes back its pointer and size,
// which takeAlloc then checks and claims.
func copyResult(v []byte, st status) ([]byte, status) {
	if st != statusOK || len(v) == 0 {
		return takeAlloc(st, 0, 0)
	}
	p := allocate(uint32(len(v)))
	copy(unsafe.Slice((*byte)(p), len(v)), v)
	return takeAlloc(st, uint32(uintptr(p)), uint32(len(v)))
}

func hostLog(level LogLevel, msg string) status { return host.log(level, msg) }
func hostGetLogLevel() (LogLevel, status)       { return host.getLogLevel() }
func hostGetCurrentTimeNanoseconds() (uint64, status) {
	return host.getCurrentTimeNanoseconds()
}
func hostSetTickPeriodMilliseconds(periodMillis uint32) status {
	return host.setTickPeriodMilliseconds(periodMillis)
}
func hostGetBufferBytes(bt BufferType, start, maxSize uint32) ([]byte, status) {
	return copyResult(host.getBufferBytes(bt, start, maxSize))
}
func hostSetBufferBytes(bt BufferType, start, size uint32, value []byte) status {
	return host.setBufferBytes(bt, start, size, value)
}
func hostGetBufferStatus(bt BufferType) (size, flags uint32, st status) {
	return host.getBufferStatus(bt)
}
func hostGetHeaderMapSize(mt MapType) (uint32, status) { return host.getHeaderMapSize(mt) }
func hostGetHeaderMapPairs(mt MapType) ([]byte, status) {
	return copyResult(host.getHeaderMapPairs(mt))
}
func hostSetHeaderMapPairs(mt MapType, data []byte) status { return host.setHeaderMapPairs(mt, data) }
func hostGetHeaderMapValue(mt MapType, key string) ([]byte, status) {
	return copyResult(host.getHeaderMapValue(mt, key))
}
func hostAddHeaderMapValue(mt MapType, key, value string) status {
	return host.addHeaderMapValue(mt, key, value)
}
func hostReplaceHeaderMapValue(mt MapType, key, value string) status {
	return host.replaceHeaderMapValue(mt, key, value)
}
func hostRemoveHeaderMapValue(mt MapType, key string) status {
	return host.removeHeaderMapValue(mt, key)
}
func hostContinueStream(st StreamType) status { return host.continueStream(st) }
func hostCloseStream(st StreamType) status    { return host.closeStream(st) }
func hostGetStatus() (code uint32, msg []byte, st status) {
	code, msg, st = host.getStatus()
	msg, st = copyResult(msg, st)
	return code, msg, st
}
func hostSendLocalResponse(statusCode uint32, details string, body, headers []byte, grpcStatus int32) status {
	return host.sendLocalResponse(statusCode, details, body, headers, grpcStatus)
}
func hostHttpCall(upstream string, headers, body, trailers []byte, timeoutMillis uint32) (uint32, status) {
	return host.httpCall(upstream, headers, body, trailers, timeoutMillis)
}
func hostSetSharedData(key string, value []byte, cas uint32) status {
	return host.setSharedData(key, value, cas)
}
func hostGetSharedData(key string) ([]byte, uint32, status) {
	value, cas, st := host.getSharedData(key)
	value, st = copyResult(value, st)
	return value, cas, st
}
func hostRegisterSharedQueue(name string) (uint32, status) {
	return host.registerSharedQueue(name)
}
func hostResolveSharedQueue(vmID, name string) (uint32, status) {
	return host.resolveSharedQueue(vmID, name)
}
func hostEnqueueSharedQueue(queueID uint32, value []byte) status {
	return host.enqueueSharedQueue(queueID, value)
}
func hostDequeueSharedQueue(queueID uint32) ([]byte, status) {
	return copyResult(host.dequeueSharedQueue(queueID))
}
func hostDefineMetric(mt MetricType, name string) (uint32, status) {
	return host.defineMetric(mt, name)
}
func hostIncrementMetric(id uint32, delta int64) status { return host.incrementMetric(id, delta) }
func hostRecordMetric(id uint32, value uint64) status   { return host.recordMetric(id, value) }
func hostGetMetric(id uint32) (uint64, status)          { return host.getMetric(id) }
func hostGetProperty(path []byte) ([]byte, status)      { return copyResult(host.getProperty(path)) }
func hostSetProperty(path, value []byte) status         { return host.setProperty(path, value) }
func hostSetEffectiveContext(contextID uint32) status {
	return host.setEffectiveContext(contextID)
}
func hostDone() status { return host.done() }

// hostEnviron is the VM's environment: the emulator's (EmulatorOptions.Env), or
// none without one.
func hostEnviron() []string {
	if e, ok := host.(*Emulator); ok {
		return e.env
	}
	return nil
}
