package host

import "strconv"

// status is proxy_status_t (spec "Types"; proxy-wasm-cpp-sdk
// proxy_wasm_common.h WasmResult).
type status uint32

const (
	statusOK                  status = 0
	statusNotFound            status = 1
	statusBadArgument         status = 2
	statusSerializationFailed status = 3
	statusInvalidMemoryAccess status = 6
	statusEmpty               status = 7
	statusCasMismatch         status = 8
	statusInternalFailure     status = 10
	statusBrokenConnection    status = 11
	statusUnimplemented       status = 12
)

func (s status) String() string {
	switch s {
	case statusOK:
		return "OK"
	case statusNotFound:
		return "NOT_FOUND"
	case statusBadArgument:
		return "BAD_ARGUMENT"
	case statusSerializationFailed:
		return "SERIALIZATION_FAILURE"
	case statusInvalidMemoryAccess:
		return "INVALID_MEMORY_ACCESS"
	case statusEmpty:
		return "EMPTY"
	case statusCasMismatch:
		return "CAS_MISMATCH"
	case statusInternalFailure:
		return "INTERNAL_FAILURE"
	case statusBrokenConnection:
		return "BROKEN_CONNECTION"
	case statusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return "STATUS_" + strconv.FormatInt(int64(s), 10)
}

// Buffer types (spec "Types").
const (
	bufRequestBody      = 0
	bufResponseBody     = 1
	bufCallResponseBody = 4
	bufVMConfig         = 6
	bufPluginConfig     = 7
)

// Map types (spec "Types").
const (
	mapRequestHeaders       = 0
	mapRequestTrailers      = 1
	mapResponseHeaders      = 2
	mapResponseTrailers     = 3
	mapCallResponseHeaders  = 6
	mapCallResponseTrailers = 7
)
