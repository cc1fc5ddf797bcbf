//go:build wasip1

package proxywasm

import "unsafe"

// Host functions of proxy-wasm ABI v0.2.1, module "env" (spec
// abi-versions/v0.2.1, section per function; signatures as in
// proxy-wasm-cpp-host include/proxy-wasm/exports.h). Every one returns a
// proxy_status_t. Sizes and ids are u32, pointers are i32 addresses in
// linear memory; return_* parameters point at a uint32 the host writes
// (32-bit little-endian) or, for u64 results, at a uint64.
//
// Every import is marked //go:noescape: the host reads the guest memory it
// is given and writes the return_* slots only during the call, and copies
// whatever it keeps (proxy-wasm-cpp-host src/exports.cc). Without the mark
// the compiler assumes the pointers escape and moves every return slot, and
// every argument buffer, to the heap, i.e. a heap allocation per hostcall.

//go:noescape
//go:wasmimport env proxy_log
func proxyLog(level uint32, msg unsafe.Pointer, msgSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_log_level
func proxyGetLogLevel(returnLevel unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_get_current_time_nanoseconds
func proxyGetCurrentTimeNanoseconds(returnTime unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(periodMillis uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bufferType, start, maxSize uint32, returnPtr, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(bufferType, start, size uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_buffer_status
func proxyGetBufferStatus(bufferType uint32, returnSize, returnFlags unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_get_header_map_size
func proxyGetHeaderMapSize(mapType uint32, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType uint32, returnPtr, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_set_header_map_pairs
func proxySetHeaderMapPairs(mapType uint32, pairs unsafe.Pointer, pairsSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, returnPtr, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32) uint32

//go:noescape
//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:noescape
//go:wasmimport env proxy_close_stream
func proxyCloseStream(streamType uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_status
func proxyGetStatus(returnCode, returnMsgPtr, returnMsgSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(statusCode uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:noescape
//go:wasmimport env proxy_http_call
func proxyHttpCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeoutMillis uint32, returnToken unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32

//go:noescape
//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, returnPtr, returnSize, returnCas unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(name unsafe.Pointer, nameSize uint32, returnID unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_resolve_shared_queue
func proxyResolveSharedQueue(vmID unsafe.Pointer, vmIDSize uint32, name unsafe.Pointer, nameSize uint32, returnID unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_enqueue_shared_queue
func proxyEnqueueSharedQueue(queueID uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_dequeue_shared_queue
func proxyDequeueSharedQueue(queueID uint32, returnPtr, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, returnID unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(metricID uint32, delta int64) uint32

//go:noescape
//go:wasmimport env proxy_record_metric
func proxyRecordMetric(metricID uint32, value uint64) uint32

//go:noescape
//go:wasmimport env proxy_get_metric
func proxyGetMetric(metricID uint32, returnValue unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_get_property
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, returnPtr, returnSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport env proxy_set_property
func proxySetProperty(path unsafe.Pointer, pathSize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:noescape
//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(contextID uint32) uint32

//go:noescape
//go:wasmimport env proxy_done
func proxyDone() uint32

// WASI preview 1 (module wasi_snapshot_preview1, witx
// wasi_snapshot_preview1.witx): the VM's environment, which Envoy fills from
// vm_config.environment_variables (host_env_keys, key_values). Each returns an
// errno, 0 on success. The Go runtime imports them too, under the same
// signatures.

//go:noescape
//go:wasmimport wasi_snapshot_preview1 environ_sizes_get
func environSizesGet(returnCount, returnBufSize unsafe.Pointer) uint32

//go:noescape
//go:wasmimport wasi_snapshot_preview1 environ_get
func environGet(environ, environBuf unsafe.Pointer) uint32
