package policysync

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

// store is shared data with Envoy's semantics (proxy-wasm-cpp-host
// src/shared_data.cc): one global cas counter that skips 0; cas 0 writes
// unconditionally; a new key is created whatever the cas.
type store struct {
	mu      sync.Mutex
	cas     uint32
	entries map[string]entry
	writes  map[string]int
	// watch, if set, sees every successful write (under the lock).
	watch func(key string, val []byte)
}

type entry struct {
	val []byte
	cas uint32
}

func newStore() *store { return &store{entries: map[string]entry{}, writes: map[string]int{}} }

func (s *store) get(key string) ([]byte, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	if !ok {
		return nil, 0, proxywasm.ErrNotFound
	}
	return append([]byte(nil), e.val...), e.cas, nil
}

func (s *store) set(key string, val []byte, cas uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[key]; ok && cas != 0 && cas != e.cas {
		return proxywasm.ErrCasMismatch
	}
	s.cas++
	if s.cas == 0 {
		s.cas++
	}
	s.entries[key] = entry{append([]byte(nil), val...), s.cas}
	s.writes[key]++
	if s.watch != nil {
		s.watch(key, val)
	}
	return nil
}

// call is one proxy_http_call a fakeHost received.
type call struct {
	cluster  string
	headers  [][2]string
	timeout  uint32
	callback func(numHeaders, bodySize, numTrailers int)
}

func (c *call) header(k string) string {
	for _, kv := range c.headers {
		if kv[0] == k {
			return kv[1]
		}
	}
	return ""
}

// fakeHost is one VM's Host over a shared store, with scripted callouts.
type fakeHost struct {
	t       testing.TB
	st      *store
	calls   []*call
	resp    *response // readable during a callback
	logs    []string
	metrics map[string]uint64
	// dispatchErr, if set, is returned by DispatchHttpCall.
	dispatchErr error
	// setErr, if set, is consulted before every SetSharedData; a non-nil
	// result is returned instead of writing.
	setErr func(key string) error
	// onOp, if set, runs before every shared-data get or set of this
	// host, outside the store's lock: a test can run another VM there.
	onOp func(op, key string)
}

type response struct {
	headers [][2]string
	body    []byte
}

func newFakeHost(t testing.TB, st *store) *fakeHost {
	return &fakeHost{t: t, st: st, metrics: map[string]uint64{}}
}

func (h *fakeHost) GetSharedData(key string) ([]byte, uint32, error) {
	if h.onOp != nil {
		h.onOp("get", key)
	}
	return h.st.get(key)
}

func (h *fakeHost) SetSharedData(key string, v []byte, cas uint32) error {
	if h.onOp != nil {
		h.onOp("set", key)
	}
	if h.setErr != nil {
		if err := h.setErr(key); err != nil {
			return err
		}
	}
	return h.st.set(key, v, cas)
}

func (h *fakeHost) DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillis uint32, cb func(int, int, int)) (uint32, error) {
	if h.dispatchErr != nil {
		return 0, h.dispatchErr
	}
	h.calls = append(h.calls, &call{cluster: cluster, headers: headers, timeout: timeoutMillis, callback: cb})
	return uint32(len(h.calls)), nil
}

func (h *fakeHost) GetHttpCallResponseHeader(key string) (string, error) {
	if h.resp == nil {
		return "", proxywasm.ErrNotFound
	}
	for _, kv := range h.resp.headers {
		if kv[0] == key {
			return kv[1], nil
		}
	}
	return "", proxywasm.ErrNotFound
}

func (h *fakeHost) GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	if h.resp == nil {
		return nil, proxywasm.ErrNotFound
	}
	b := h.resp.body
	if start > len(b) {
		return nil, proxywasm.ErrBadArgument
	}
	b = b[start:]
	if len(b) > maxSize {
		b = b[:maxSize]
	}
	return append([]byte(nil), b...), nil
}

func (h *fakeHost) Log(level proxywasm.LogLevel, msg string) {
	h.logs = append(h.logs, levelName(level)+": "+msg)
}

func levelName(l proxywasm.LogLevel) string {
	return [...]string{"trace", "debug", "info", "warn", "error", "critical"}[l]
}

func (h *fakeHost) Counter(name string, delta uint64) { h.metrics[name] += delta }
func (h *fakeHost) Gauge(name string, value uint64)   { h.metrics[name] = value }

// pending returns the last call if it has not been answered.
func (h *fakeHost) lastCall() *call {
	h.t.Helper()
	if len(h.calls) == 0 {
		h.t.Fatal("no HTTP call was dispatched")
	}
	return h.calls[len(h.calls)-1]
}

// respond answers call c: status with headers and body, as
// proxy_on_http_call_response would deliver it.
func (h *fakeHost) respond(c *call, status string, headers [][2]string, body string) {
	h.resp = &response{headers: append([][2]string{{":status", status}}, headers...), body: []byte(body)}
	c.callback(len(h.resp.headers), len(body), 0)
	h.resp = nil
}

// reset answers c with a failure: (0, 0, 0).
func (h *fakeHost) reset(c *call) { c.callback(0, 0, 0) }

// logsWith returns the log lines containing s.
func (h *fakeHost) logsWith(s string) []string {
	var out []string
	for _, l := range h.logs {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
