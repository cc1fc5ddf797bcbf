package proxywasm

import (
	"errors"
	"strconv"
)

// status is a proxy_status_t returned by every hostcall (spec v0.2.1
// "Types"; 11 is Envoy's BrokenConnection, outside the spec list).
type status uint32

const (
	statusOK                  status = 0
	statusNotFound            status = 1
	statusBadArgument         status = 2
	statusSerializationFail   status = 3
	statusParseFailure        status = 4
	statusInvalidMemoryAccess status = 6
	statusEmpty               status = 7
	statusCasMismatch         status = 8
	statusInternalFailure     status = 10
	statusBrokenConnection    status = 11
	statusUnimplemented       status = 12
)

// Sentinel errors for the proxy_status_t codes a hostcall can return (spec
// v0.2.1 "Types"); compare with errors.Is. Codes without a sentinel come
// back as a *StatusError.
var (
	// ErrNotFound is status 1 (NOT_FOUND): no such header, key, property,
	// queue, metric or buffer in this context.
	ErrNotFound = errors.New("proxywasm: not found (status 1)")
	// ErrBadArgument is status 2 (BAD_ARGUMENT), e.g. an unknown cluster or
	// missing pseudo-header in proxy_http_call, or a counter increment ≤ 0.
	ErrBadArgument = errors.New("proxywasm: bad argument (status 2)")
	// ErrSerializationFailure is status 3 (SERIALIZATION_FAILURE).
	ErrSerializationFailure = errors.New("proxywasm: serialization failure (status 3)")
	// ErrParseFailure is status 4 (PARSE_FAILURE).
	ErrParseFailure = errors.New("proxywasm: parse failure (status 4)")
	// ErrInvalidMemoryAccess is status 6 (INVALID_MEMORY_ACCESS). This
	// package also returns it when the host hands back memory that did not
	// come from proxy_on_memory_allocate during the same hostcall.
	ErrInvalidMemoryAccess = errors.New("proxywasm: invalid memory access (status 6)")
	// ErrEmpty is status 7 (EMPTY): proxy_dequeue_shared_queue on an empty
	// queue.
	ErrEmpty = errors.New("proxywasm: empty (status 7)")
	// ErrCasMismatch is status 8 (CAS_MISMATCH): proxy_set_shared_data with
	// a non-zero cas that is not the key's current cas.
	ErrCasMismatch = errors.New("proxywasm: cas mismatch (status 8)")
	// ErrInternalFailure is status 10 (INTERNAL_FAILURE).
	ErrInternalFailure = errors.New("proxywasm: internal failure (status 10)")
	// ErrBrokenConnection is status 11 (BrokenConnection), used by Envoy's
	// proxy_get_status after a failed HTTP call.
	ErrBrokenConnection = errors.New("proxywasm: broken connection (status 11)")
	// ErrUnimplemented is status 12 (UNIMPLEMENTED): the host lacks the call
	// (and every call outside the wasm build).
	ErrUnimplemented = errors.New("proxywasm: unimplemented (status 12)")
)

// StatusError is a proxy_status_t for which there is no sentinel error,
// e.g. 5 (BadExpression) or 9 (ResultMismatch).
type StatusError struct {
	Code uint32
}

// Error returns "proxywasm: host returned status <Code>".
func (e *StatusError) Error() string {
	return "proxywasm: host returned status " + strconv.FormatUint(uint64(e.Code), 10)
}

// statusError maps a proxy_status_t to nil or an error.
func statusError(st status) error {
	switch st {
	case statusOK:
		return nil
	case statusNotFound:
		return ErrNotFound
	case statusBadArgument:
		return ErrBadArgument
	case statusSerializationFail:
		return ErrSerializationFailure
	case statusParseFailure:
		return ErrParseFailure
	case statusInvalidMemoryAccess:
		return ErrInvalidMemoryAccess
	case statusEmpty:
		return ErrEmpty
	case statusCasMismatch:
		return ErrCasMismatch
	case statusInternalFailure:
		return ErrInternalFailure
	case statusBrokenConnection:
		return ErrBrokenConnection
	case statusUnimplemented:
		return ErrUnimplemented
	default:
		return &StatusError{Code: uint32(st)}
	}
}
