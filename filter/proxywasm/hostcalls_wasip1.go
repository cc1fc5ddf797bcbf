//go:build wasip1

package proxywasm

import "unsafe"

// Typed wrappers over the raw imports. hostcalls_other.go has the same
// functions for native builds. Results the host allocates are claimed with
// takeAlloc.

// Return slots of the hostcalls during which the host calls back into the
// guest (proxy_on_memory_allocate, to place the result; proxy-wasm-cpp-host
// WasmBase::copyToPointerSize allocates first and writes the pointer and
// size after). They are package variables, in static memory, and not
// locals: the callback runs Go code on the same goroutine, whose stack may
// grow and move meanwhile, and the host would then write to where a local
// used to be (the imports are //go:noescape, so locals stay on the stack).
// A VM runs one call at a time and the allocator makes no hostcall, so one
// set of slots serves every such call.
var retPtr, retSize, retCas, retCode uint32

func strPtr(s string) unsafe.Pointer   { return unsafe.Pointer(unsafe.StringData(s)) }
func bytesPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

func hostLog(level LogLevel, msg string) status {
	return status(proxyLog(uint32(level), strPtr(msg), uint32(len(msg))))
}

func hostGetLogLevel() (LogLevel, status) {
	var level uint32
	st := status(proxyGetLogLevel(unsafe.Pointer(&level)))
	return LogLevel(level), st
}

func hostGetCurrentTimeNanoseconds() (uint64, status) {
	var t uint64
	st := status(proxyGetCurrentTimeNanoseconds(unsafe.Pointer(&t)))
	return t, st
}

func hostSetTickPeriodMilliseconds(periodMillis uint32) status {
	return status(proxySetTickPeriodMilliseconds(periodMillis))
}

func hostGetBufferBytes(bt BufferType, start, maxSize uint32) ([]byte, status) {
	st := status(proxyGetBufferBytes(uint32(bt), start, maxSize, unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	return takeAlloc(st, retPtr, retSize)
}

func hostSetBufferBytes(bt BufferType, start, size uint32, value []byte) status {
	return status(proxySetBufferBytes(uint32(bt), start, size, bytesPtr(value), uint32(len(value))))
}

func hostGetBufferStatus(bt BufferType) (size, flags uint32, st status) {
	st = status(proxyGetBufferStatus(uint32(bt), unsafe.Pointer(&size), unsafe.Pointer(&flags)))
	return size, flags, st
}

func hostGetHeaderMapSize(mt MapType) (uint32, status) {
	var size uint32
	st := status(proxyGetHeaderMapSize(uint32(mt), unsafe.Pointer(&size)))
	return size, st
}

func hostGetHeaderMapPairs(mt MapType) ([]byte, status) {
	st := status(proxyGetHeaderMapPairs(uint32(mt), unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	return takeAlloc(st, retPtr, retSize)
}

func hostSetHeaderMapPairs(mt MapType, data []byte) status {
	return status(proxySetHeaderMapPairs(uint32(mt), bytesPtr(data), uint32(len(data))))
}

func hostGetHeaderMapValue(mt MapType, key string) ([]byte, status) {
	st := status(proxyGetHeaderMapValue(uint32(mt), strPtr(key), uint32(len(key)), unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	return takeAlloc(st, retPtr, retSize)
}

func hostAddHeaderMapValue(mt MapType, key, value string) status {
	return status(proxyAddHeaderMapValue(uint32(mt), strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

func hostReplaceHeaderMapValue(mt MapType, key, value string) status {
	return status(proxyReplaceHeaderMapValue(uint32(mt), strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

func hostRemoveHeaderMapValue(mt MapType, key string) status {
	return status(proxyRemoveHeaderMapValue(uint32(mt), strPtr(key), uint32(len(key))))
}

func hostContinueStream(st StreamType) status { return status(proxyContinueStream(uint32(st))) }

func hostCloseStream(st StreamType) status { return status(proxyCloseStream(uint32(st))) }

func hostGetStatus() (code uint32, msg []byte, st status) {
	st = status(proxyGetStatus(unsafe.Pointer(&retCode), unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	msg, st = takeAlloc(st, retPtr, retSize)
	return retCode, msg, st
}

func hostSendLocalResponse(statusCode uint32, details string, body, headers []byte, grpcStatus int32) status {
	return status(proxySendLocalResponse(statusCode,
		strPtr(details), uint32(len(details)),
		bytesPtr(body), uint32(len(body)),
		bytesPtr(headers), uint32(len(headers)),
		grpcStatus))
}

func hostHttpCall(upstream string, headers, body, trailers []byte, timeoutMillis uint32) (uint32, status) {
	var token uint32
	st := status(proxyHttpCall(
		strPtr(upstream), uint32(len(upstream)),
		bytesPtr(headers), uint32(len(headers)),
		bytesPtr(body), uint32(len(body)),
		bytesPtr(trailers), uint32(len(trailers)),
		timeoutMillis, unsafe.Pointer(&token)))
	return token, st
}

func hostSetSharedData(key string, value []byte, cas uint32) status {
	return status(proxySetSharedData(strPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value)), cas))
}

func hostGetSharedData(key string) ([]byte, uint32, status) {
	st := status(proxyGetSharedData(strPtr(key), uint32(len(key)), unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize), unsafe.Pointer(&retCas)))
	value, st := takeAlloc(st, retPtr, retSize)
	return value, retCas, st
}

func hostRegisterSharedQueue(name string) (uint32, status) {
	var id uint32
	st := status(proxyRegisterSharedQueue(strPtr(name), uint32(len(name)), unsafe.Pointer(&id)))
	return id, st
}

func hostResolveSharedQueue(vmID, name string) (uint32, status) {
	var id uint32
	st := status(proxyResolveSharedQueue(strPtr(vmID), uint32(len(vmID)), strPtr(name), uint32(len(name)), unsafe.Pointer(&id)))
	return id, st
}

func hostEnqueueSharedQueue(queueID uint32, value []byte) status {
	return status(proxyEnqueueSharedQueue(queueID, bytesPtr(value), uint32(len(value))))
}

func hostDequeueSharedQueue(queueID uint32) ([]byte, status) {
	st := status(proxyDequeueSharedQueue(queueID, unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	return takeAlloc(st, retPtr, retSize)
}

func hostDefineMetric(mt MetricType, name string) (uint32, status) {
	var id uint32
	st := status(proxyDefineMetric(uint32(mt), strPtr(name), uint32(len(name)), unsafe.Pointer(&id)))
	return id, st
}

func hostIncrementMetric(id uint32, delta int64) status {
	return status(proxyIncrementMetric(id, delta))
}

func hostRecordMetric(id uint32, value uint64) status { return status(proxyRecordMetric(id, value)) }

func hostGetMetric(id uint32) (uint64, status) {
	var v uint64
	st := status(proxyGetMetric(id, unsafe.Pointer(&v)))
	return v, st
}

func hostGetProperty(path []byte) ([]byte, status) {
	st := status(proxyGetProperty(bytesPtr(path), uint32(len(path)), unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)))
	return takeAlloc(st, retPtr, retSize)
}

func hostSetProperty(path, value []byte) status {
	return status(proxySetProperty(bytesPtr(path), uint32(len(path)), bytesPtr(value), uint32(len(value))))
}

func hostSetEffectiveContext(contextID uint32) status {
	return status(proxySetEffectiveContext(contextID))
}

func hostDone() status { return status(proxyDone()) }

// hostEnviron is the VM's environment: WASI environ_sizes_get for the count and
// the bytes of the NUL-terminated "NAME=value" strings, then environ_get, which
// writes the strings into one buffer and a pointer to each into another.
func hostEnviron() []string {
	var count, size uint32
	if environSizesGet(unsafe.Pointer(&count), unsafe.Pointer(&size)) != 0 || count == 0 || size == 0 {
		return nil
	}
	ptrs := make([]uint32, count)
	buf := make([]byte, size)
	if environGet(unsafe.Pointer(&ptrs[0]), unsafe.Pointer(&buf[0])) != 0 {
		return nil
	}
	out := make([]string, 0, count)
	start := 0
	for i, b := range buf {
		if b == 0 {
			out = append(out, string(buf[start:i]))
			start = i + 1
		}
	}
	return out
}
