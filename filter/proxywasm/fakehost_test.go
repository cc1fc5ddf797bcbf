//go:build !wasip1

package proxywasm

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter/proxywasm/pairs"
)

// fakeHost is an in-memory host for native tests. It records a trace of
// the hostcalls it served, one line per call, so tests can assert the
// exact sequence.
type fakeHost struct {
	unimplementedHost
	trace []string

	logs     []string // "<level> <msg>"
	level    LogLevel
	levelSt  status
	maps     map[MapType][]byte // serialized
	buffers  map[BufferType][]byte
	shared   map[string]sharedEntry
	nextCas  uint32
	property map[string][]byte // by NUL-joined path

	httpCallStatus status
	nextToken      uint32
	httpCalls      []fakeHTTPCall

	effective uint32
	metrics   map[uint32]uint64
	localResp []string
	statusMsg string
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

type fakeHTTPCall struct {
	cluster  string
	headers  [][2]string
	body     string
	trailers [][2]string
	timeout  uint32
}

// installFakeHost resets the package state, installs a fresh fake host and
// restores the unimplemented host when the test ends.
func installFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	f := &fakeHost{
		levelSt:  statusUnimplemented,
		maps:     map[MapType][]byte{},
		buffers:  map[BufferType][]byte{},
		shared:   map[string]sharedEntry{},
		property: map[string][]byte{},
		metrics:  map[uint32]uint64{},
		nextCas:  1,
	}
	host = f
	hostLogLevel, hostLogLevelKnown = 0, false
	SetVMContext(nil)
	t.Cleanup(func() {
		host = unimplementedHost{}
		hostLogLevel, hostLogLevelKnown = 0, false
		SetVMContext(nil)
	})
	return f
}

func (f *fakeHost) record(s string) { f.trace = append(f.trace, s) }

func (f *fakeHost) log(level LogLevel, msg string) status {
	f.logs = append(f.logs, strconv.FormatUint(uint64(uint32(level)), 10)+" "+msg)
	return statusOK
}

func (f *fakeHost) getLogLevel() (LogLevel, status) {
	f.record("get_log_level")
	return f.level, f.levelSt
}

func (f *fakeHost) getCurrentTimeNanoseconds() (uint64, status) {
	return 1_700_000_000_123_456_789, statusOK
}

func (f *fakeHost) getBufferBytes(bt BufferType, start, maxSize uint32) ([]byte, status) {
	f.record("get_buffer_bytes " + strconv.FormatUint(uint64(uint32(bt)), 10) + " " + strconv.FormatUint(uint64(start), 10) + " " + strconv.FormatUint(uint64(maxSize), 10))
	b, ok := f.buffers[bt]
	if !ok {
		return nil, statusNotFound
	}
	if start > uint32(len(b)) {
		return nil, statusOK
	}
	end := uint64(start) + uint64(maxSize)
	if end > uint64(len(b)) {
		end = uint64(len(b))
	}
	if end == uint64(start) {
		return nil, statusOK
	}
	return append([]byte(nil), b[start:end]...), statusOK
}

func (f *fakeHost) setBufferBytes(bt BufferType, start, size uint32, value []byte) status {
	f.record("set_buffer_bytes " + strconv.FormatUint(uint64(uint32(bt)), 10) + " " + strconv.FormatUint(uint64(start), 10) + " " + strconv.FormatUint(uint64(size), 10) + " " + string(value))
	return statusOK
}

func (f *fakeHost) getHeaderMapPairs(mt MapType) ([]byte, status) {
	f.record("get_header_map_pairs " + strconv.FormatUint(uint64(uint32(mt)), 10))
	b, ok := f.maps[mt]
	if !ok {
		return nil, statusNotFound
	}
	return append([]byte(nil), b...), statusOK
}

func (f *fakeHost) setHeaderMapPairs(mt MapType, data []byte) status {
	f.record("set_header_map_pairs " + strconv.FormatUint(uint64(uint32(mt)), 10))
	f.maps[mt] = append([]byte(nil), data...)
	return statusOK
}

func (f *fakeHost) getHeaderMapValue(mt MapType, key string) ([]byte, status) {
	f.record("get_header_map_value " + strconv.FormatUint(uint64(uint32(mt)), 10) + " " + key)
	ps, err := pairs.Decode(f.maps[mt])
	if err != nil {
		return nil, statusSerializationFail
	}
	for _, p := range ps {
		if p[0] == key {
			return []byte(p[1]), statusOK
		}
	}
	return nil, statusNotFound
}

func (f *fakeHost) addHeaderMapValue(mt MapType, key, value string) status {
	f.record("add_header_map_value " + strconv.FormatUint(uint64(uint32(mt)), 10) + " " + key + " " + value)
	ps, _ := pairs.Decode(f.maps[mt])
	f.maps[mt] = pairs.Encode(append(ps, [2]string{key, value}))
	return statusOK
}

func (f *fakeHost) replaceHeaderMapValue(mt MapType, key, value string) status {
	f.record("replace_header_map_value " + strconv.FormatUint(uint64(uint32(mt)), 10) + " " + key + " " + value)
	return statusOK
}

func (f *fakeHost) removeHeaderMapValue(mt MapType, key string) status {
	f.record("remove_header_map_value " + strconv.FormatUint(uint64(uint32(mt)), 10) + " " + key)
	return statusOK
}

func (f *fakeHost) continueStream(st StreamType) status {
	f.record("continue_stream " + strconv.FormatUint(uint64(uint32(st)), 10) + " effective=" + strconv.FormatUint(uint64(f.effective), 10))
	return statusOK
}

func (f *fakeHost) closeStream(st StreamType) status {
	f.record("close_stream " + strconv.FormatUint(uint64(uint32(st)), 10))
	return statusOK
}

func (f *fakeHost) getStatus() (uint32, []byte, status) {
	return uint32(statusBrokenConnection), []byte(f.statusMsg), statusOK
}

func (f *fakeHost) sendLocalResponse(code uint32, details string, body, headers []byte, grpcStatus int32) status {
	ps, err := pairs.Decode(headers)
	if err != nil {
		return statusSerializationFail
	}
	var hs []string
	for _, p := range ps {
		hs = append(hs, p[0]+"="+p[1])
	}
	f.localResp = append(f.localResp, strconv.FormatUint(uint64(code), 10)+" "+details+" ["+strings.Join(hs, ",")+"] "+string(body)+" "+strconv.Itoa(int(grpcStatus)))
	return statusOK
}

func (f *fakeHost) httpCall(upstream string, headers, body, trailers []byte, timeoutMillis uint32) (uint32, status) {
	if f.httpCallStatus != statusOK {
		return 0, f.httpCallStatus
	}
	hs, err := pairs.Decode(headers)
	if err != nil {
		return 0, statusSerializationFail
	}
	ts, err := pairs.Decode(trailers)
	if err != nil {
		return 0, statusSerializationFail
	}
	f.nextToken++
	f.httpCalls = append(f.httpCalls, fakeHTTPCall{upstream, hs, string(body), ts, timeoutMillis})
	return f.nextToken, statusOK
}

// setSharedData follows Envoy (proxy-wasm-cpp-host src/shared_data.cc): cas 0
// is unconditional, a stale non-zero cas is CAS_MISMATCH.
func (f *fakeHost) setSharedData(key string, value []byte, cas uint32) status {
	f.record("set_shared_data " + key + " " + strconv.FormatUint(uint64(cas), 10))
	if e, ok := f.shared[key]; ok && cas != 0 && cas != e.cas {
		return statusCasMismatch
	}
	f.shared[key] = sharedEntry{append([]byte(nil), value...), f.nextCas}
	f.nextCas++
	return statusOK
}

func (f *fakeHost) getSharedData(key string) ([]byte, uint32, status) {
	e, ok := f.shared[key]
	if !ok {
		return nil, 0, statusNotFound
	}
	return append([]byte(nil), e.value...), e.cas, statusOK
}

func (f *fakeHost) dequeueSharedQueue(queueID uint32) ([]byte, status) {
	return nil, statusEmpty
}

func (f *fakeHost) defineMetric(mt MetricType, name string) (uint32, status) {
	f.record("define_metric " + strconv.FormatUint(uint64(uint32(mt)), 10) + " " + name)
	return 4 + uint32(mt), statusOK
}

func (f *fakeHost) incrementMetric(id uint32, delta int64) status {
	f.record("increment_metric " + strconv.FormatUint(uint64(id), 10) + " " + strconv.FormatInt(delta, 10))
	f.metrics[id] += uint64(delta)
	return statusOK
}

func (f *fakeHost) recordMetric(id uint32, value uint64) status {
	f.record("record_metric " + strconv.FormatUint(uint64(id), 10) + " " + strconv.FormatUint(value, 10))
	f.metrics[id] = value
	return statusOK
}

func (f *fakeHost) getMetric(id uint32) (uint64, status) { return f.metrics[id], statusOK }

func (f *fakeHost) getProperty(path []byte) ([]byte, status) {
	f.record("get_property " + strconv.Quote(string(path)))
	v, ok := f.property[string(path)]
	if !ok {
		return nil, statusNotFound
	}
	return append([]byte(nil), v...), statusOK
}

func (f *fakeHost) setProperty(path, value []byte) status {
	f.record("set_property " + strconv.Quote(string(path)))
	f.property[string(path)] = append([]byte(nil), value...)
	return statusOK
}

func (f *fakeHost) setEffectiveContext(id uint32) status {
	f.record("set_effective_context " + strconv.FormatUint(uint64(id), 10))
	f.effective = id
	return statusOK
}
