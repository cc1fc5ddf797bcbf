package host

import (
	"sort"
	"strings"
	"sync"
)

// sharedStore is CPPHOST src/shared_data.cc and src/shared_queue.cc for
// one Host: one key/value map per vm_id, one global cas counter, and the
// shared queues.
type sharedStore struct {
	mu      sync.Mutex
	data    map[string]map[string]*sharedEntry
	lastCas uint32

	queues      map[string]*sharedQueue // vm_id + "\x00" + name
	queueTokens map[uint32]*sharedQueue
	lastToken   uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

type sharedQueue struct {
	token  uint32
	items  [][]byte
	owner  *vm
	rootID uint32
}

func newSharedStore() *sharedStore {
	return &sharedStore{data: map[string]map[string]*sharedEntry{}, queues: map[string]*sharedQueue{}, queueTokens: map[uint32]*sharedQueue{}}
}

// nextCas is SharedData::nextCas: a global counter starting at 1 that
// skips 0 when it wraps.
func (s *sharedStore) nextCas() uint32 {
	s.lastCas++
	if s.lastCas == 0 {
		s.lastCas++
	}
	return s.lastCas
}

func (s *sharedStore) get(vmID, key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.data[vmID][key]
	if e == nil {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// keys returns vmID's keys, sorted.
func (s *sharedStore) keys(vmID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.data[vmID]))
	for k := range s.data[vmID] {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// set is SharedData::set: a new key is always created; an existing key
// with a non-zero cas that differs from the stored one is CAS_MISMATCH;
// cas 0 writes unconditionally. There is no deletion.
func (s *sharedStore) set(vmID, key string, value []byte, cas uint32) (uint32, status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.data[vmID]
	if m == nil {
		m = map[string]*sharedEntry{}
		s.data[vmID] = m
	}
	e := m[key]
	if e != nil && cas != 0 && cas != e.cas {
		return 0, statusCasMismatch
	}
	if e == nil {
		e = &sharedEntry{}
		m[key] = e
	}
	e.value = append(e.value[:0:0], value...)
	e.cas = s.nextCas()
	return e.cas, statusOK
}

func hostRegisterQueue(v *vm, s []uint64) status {
	name, ok := v.readString(uint32(s[0]), uint32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	st := v.h.store
	st.mu.Lock()
	key := v.h.cfg.VMID + "\x00" + name
	q := st.queues[key]
	if q == nil {
		st.lastToken++
		q = &sharedQueue{token: st.lastToken}
		st.queues[key] = q
		st.queueTokens[q.token] = q
	}
	// SharedQueue::registerQueue: re-registering keeps the data and
	// re-points notifications to the latest registrant.
	q.owner, q.rootID = v, v.rootID
	tok := q.token
	st.mu.Unlock()
	if !v.writeU32(uint32(s[2]), tok) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostResolveQueue(v *vm, s []uint64) status {
	vmID, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	name, ok2 := v.readString(uint32(s[2]), uint32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	if vmID == "" {
		vmID = v.h.cfg.VMID // an empty vm_id means the caller's own
	}
	st := v.h.store
	st.mu.Lock()
	q := st.queues[vmID+"\x00"+name]
	st.mu.Unlock()
	if q == nil {
		return statusNotFound
	}
	if !v.writeU32(uint32(s[4]), q.token) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func hostEnqueue(v *vm, s []uint64) status {
	val, ok := v.read(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	st := v.h.store
	st.mu.Lock()
	q := st.queueTokens[uint32(s[0])]
	if q == nil {
		st.mu.Unlock()
		return statusNotFound
	}
	q.items = append(q.items, append([]byte(nil), val...))
	owner, root, tok := q.owner, q.rootID, q.token
	st.mu.Unlock()
	// Posted to the registrant's dispatcher (Wasm::callOnThreadFunction):
	// never inside the current VM call.
	owner.post(func() { _, _ = owner.callback("proxy_on_queue_ready", uint64(root), uint64(tok)) })
	return statusOK
}

func hostDequeue(v *vm, s []uint64) status {
	st := v.h.store
	st.mu.Lock()
	q := st.queueTokens[uint32(s[0])]
	if q == nil {
		st.mu.Unlock()
		return statusNotFound
	}
	if len(q.items) == 0 {
		st.mu.Unlock()
		return statusEmpty
	}
	item := q.items[0]
	q.items = q.items[1:]
	st.mu.Unlock()
	return v.copyOut(item, uint32(s[1]), uint32(s[2]))
}

// metricStore holds the Envoy stats behind guest metrics, by name, shared
// by every VM (values aggregate across workers; docs/ENVOY.md, Metrics).
type metricStore struct {
	mu     sync.Mutex
	byName map[string]*metric
}

type metric struct {
	typ     MetricType
	value   int64
	samples []uint64
}

func newMetricStore() *metricStore { return &metricStore{byName: map[string]*metric{}} }

const metricPrefix = "wasmcustom."

func (s *metricStore) define(t MetricType, name string) *metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := metricPrefix + name
	m := s.byName[key]
	if m == nil || m.typ != t {
		m = &metric{typ: t}
		s.byName[key] = m
	}
	return m
}

func (s *metricStore) increment(m *metric, delta int64) status {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m.typ {
	case MetricCounter:
		if delta <= 0 {
			return statusBadArgument // ENVOY-CTX incrementMetric
		}
		m.value += delta
	case MetricGauge:
		m.value += delta
	default:
		return statusBadArgument
	}
	return statusOK
}

func (s *metricStore) record(m *metric, val uint64) status {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m.typ {
	case MetricCounter:
		m.value += int64(val) // ENVOY-CTX recordMetric: a counter adds.
	case MetricGauge:
		m.value = int64(val)
	case MetricHistogram:
		m.samples = append(m.samples, val)
		m.value++
	}
	return statusOK
}

func (s *metricStore) get(m *metric) (uint64, status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.typ == MetricHistogram {
		return 0, statusBadArgument // ENVOY-CTX getMetric
	}
	return uint64(m.value), statusOK
}

// names returns every defined metric's name without Envoy's prefix, sorted.
func (s *metricStore) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.byName))
	for k := range s.byName {
		out = append(out, strings.TrimPrefix(k, metricPrefix))
	}
	sortStrings(out)
	return out
}

func (s *metricStore) lookup(name string) (Metric, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !strings.HasPrefix(name, metricPrefix) {
		name = metricPrefix + name
	}
	m := s.byName[name]
	if m == nil {
		return Metric{}, false
	}
	return Metric{Type: m.typ, Value: m.value, Samples: append([]uint64(nil), m.samples...)}, true
}

func sortStrings(s []string) { sort.Strings(s) }

func hostSetSharedData(v *vm, s []uint64) status {
	key, ok1 := v.readString(uint32(s[0]), uint32(s[1]))
	val, ok2 := v.read(uint32(s[2]), uint32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	if hook := v.h.cfg.SharedDataHook; hook != nil {
		hook(v.index, v.callName, "set", key)
	}
	_, st := v.h.store.set(v.h.cfg.VMID, key, val, uint32(s[4]))
	return st
}

func hostGetSharedData(v *vm, s []uint64) status {
	key, ok := v.readString(uint32(s[0]), uint32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	if hook := v.h.cfg.SharedDataHook; hook != nil {
		hook(v.index, v.callName, "get", key)
	}
	val, cas, found := v.h.store.get(v.h.cfg.VMID, key)
	if !found {
		return statusNotFound
	}
	if st := v.copyOut(val, uint32(s[2]), uint32(s[3])); st != statusOK {
		return st
	}
	if !v.writeU32(uint32(s[4]), cas) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}
