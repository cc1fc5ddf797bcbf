package quota

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Backend stores the quota state of counter keys: per key a hash of fields (see
// ledger.go), whose "h" field (the header) every write compares and swaps. Any
// number of control-plane replicas may share one backend.
type Backend interface {
	// Load returns, for each read, the key's header and the fields named (nil
	// for one the key has not), and, when the read asks for a scan, about
	// Scan.Count more fields from Scan.Cursor on and the cursor to continue from.
	// An error means the backend could not answer; nothing may be granted then.
	Load(ctx context.Context, reads []Read) ([]Snapshot, error)
	// Swap applies each op iff the key's header is still op.Old (nil: no key),
	// and reports per op whether it was applied. An error means the backend
	// could not answer for the batch: some ops may have been applied (each
	// atomically).
	Swap(ctx context.Context, ops []Op) ([]bool, error)
}

// Read is what Load reads of one key.
type Read struct {
	Key    string
	Fields []string
	// Scan, when Count > 0, also returns fields from Cursor on (HSCAN).
	Scan Scan
}

// Scan is the position and size of a scan of a key's fields: Cursor "" starts
// one; a Snapshot.Cursor of "" means the scan came round.
type Scan struct {
	Cursor string
	Count  int
}

// Snapshot is what Load read of one key.
type Snapshot struct {
	Header  []byte   // nil: the key has no value
	Fields  [][]byte // per Read.Fields, nil for an absent field
	Scanned []Field
	Cursor  string
}

// Field is a named field of a key.
type Field struct {
	Name  string
	Value []byte
}

// Delta adds By to the integer field Name (HINCRBY), removing it at zero or below.
type Delta struct {
	Name string
	By   int64
}

// Op is one compare-and-swap: if Key's header is Old, set it to New with the
// fields Set, delete the fields Del, apply Add, and expire the key after TTL
// (0: keep the expiry the key has, as Redis's HSET does; a new key must have
// one).
type Op struct {
	Key      string
	Old, New []byte
	Set      []Field
	Del      []string
	Add      []Delta
	TTL      time.Duration
}

// Memory is the in-process Backend of the embedded store (one control-plane
// replica): a mutex-protected map whose entries expire. Its clock is Now.
type Memory struct {
	// Now is the clock for expiry; nil means time.Now.
	Now func() time.Time
	// MaxKeys bounds the live keys (default DefaultMemoryMaxKeys): a swap that
	// would create one more, after expired keys are swept, fails with
	// ErrMemoryFull, as a Redis at its maxmemory refuses writes (OOM), so the
	// request is answered 503 and the Envoys degrade per on_quota_failure.
	MaxKeys int

	mu        sync.Mutex
	m         map[string]memEntry
	swaps     int
	lastSweep time.Time // of a sweep for room: at most one a second while full
}

type memEntry struct {
	fields map[string][]byte
	exp    time.Time
}

// DefaultMemoryMaxKeys is Memory.MaxKeys' default: a million counter keys.
const DefaultMemoryMaxKeys = 1 << 20

// ErrMemoryFull is the error of a Memory swap that would hold more than MaxKeys keys.
var ErrMemoryFull = errors.New("quota: the in-memory quota store holds its maximum number of keys")

// NewMemory returns an empty Memory backend.
func NewMemory() *Memory { return &Memory{m: make(map[string]memEntry)} }

func (m *Memory) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Load implements Backend. A scan returns fields in name order after Cursor
// (the last name it returned).
func (m *Memory) Load(ctx context.Context, reads []Read) ([]Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]Snapshot, len(reads))
	for i, r := range reads {
		e, ok := m.m[r.Key]
		if !ok || !now.Before(e.exp) {
			out[i].Fields = make([][]byte, len(r.Fields))
			continue
		}
		out[i].Header = e.fields[headerField]
		out[i].Fields = make([][]byte, len(r.Fields))
		for j, f := range r.Fields {
			out[i].Fields[j] = e.fields[f]
		}
		if r.Scan.Count > 0 {
			names := make([]string, 0, len(e.fields))
			for f := range e.fields {
				if f > r.Scan.Cursor {
					names = append(names, f)
				}
			}
			slices.Sort(names)
			if len(names) > r.Scan.Count {
				names = names[:r.Scan.Count]
				out[i].Cursor = names[len(names)-1]
			}
			for _, f := range names {
				out[i].Scanned = append(out[i].Scanned, Field{Name: f, Value: e.fields[f]})
			}
		}
	}
	return out, nil
}

// Swap implements Backend.
func (m *Memory) Swap(ctx context.Context, ops []Op) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]bool, len(ops))
	for i, op := range ops {
		e, ok := m.m[op.Key]
		if ok && !now.Before(e.exp) {
			ok = false
		}
		var cur []byte
		if ok {
			cur = e.fields[headerField]
		}
		if !bytes.Equal(cur, op.Old) {
			continue
		}
		if !ok {
			if err := m.room(now); err != nil {
				return nil, err
			}
			e = memEntry{fields: map[string][]byte{}}
		}
		out[i] = true
		e.fields[headerField] = op.New
		for _, f := range op.Set {
			e.fields[f.Name] = f.Value
		}
		for _, f := range op.Del {
			delete(e.fields, f)
		}
		for _, d := range op.Add {
			n, _ := strconv.ParseInt(string(e.fields[d.Name]), 10, 64)
			if n += d.By; n > 0 {
				e.fields[d.Name] = strconv.AppendInt(nil, n, 10)
			} else {
				delete(e.fields, d.Name)
			}
		}
		if op.TTL > 0 || e.exp.IsZero() {
			e.exp = now.Add(op.TTL)
		}
		m.m[op.Key] = e
	}
	// Sweep expired entries now and then so the map does not grow without bound.
	if m.swaps++; m.swaps%1024 == 0 {
		m.sweep(now)
	}
	return out, nil
}

// room makes sure one more key fits, sweeping expired ones if need be.
func (m *Memory) room(now time.Time) error {
	maxKeys := m.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMemoryMaxKeys
	}
	if len(m.m) < maxKeys {
		return nil
	}
	if now.Sub(m.lastSweep) >= time.Second {
		m.lastSweep = now
		m.sweep(now)
		if len(m.m) < maxKeys {
			return nil
		}
	}
	return ErrMemoryFull
}

func (m *Memory) sweep(now time.Time) {
	for k, e := range m.m {
		if !now.Before(e.exp) {
			delete(m.m, k)
		}
	}
}

// Len returns the number of live keys (for tests and metrics).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, n := m.now(), 0
	for _, e := range m.m {
		if now.Before(e.exp) {
			n++
		}
	}
	return n
}

// casScript applies Ops, one per key: the op on KEYS[k] is applied iff the
// hash's "h" field is its Old ("" meaning absent). Each op's ARGV, in the
// keys' order: Old, the new header, the expiry in ms ("0": the key keeps the
// one it has; no PEXPIRE), then a count and that many name/value pairs to set,
// a count and names to delete, a count and name/increment pairs to add (a
// field at zero or below is deleted). The header and the fields are set by one
// HSET, and the deletions made by one HDEL, of at most 512 arguments each
// (Lua's unpack takes a bounded number). It returns per key 1 (applied), 0
// (the header differed) or the error of reading the header (a key that is not
// a hash: WRONGTYPE), which leaves the other keys' ops to apply. On a Redis
// Cluster it is called with one key, so it runs on the node owning that key's
// slot; on one server with the ops of several rounds (swapBatch).
var casScript = redis.NewScript(`local chunk = 512
local out = {}
local i = 1
for k = 1, #KEYS do
  local key = KEYS[k]
  local nset = tonumber(ARGV[i + 3])
  local ndel = tonumber(ARGV[i + 4 + 2 * nset])
  local nadd = tonumber(ARGV[i + 5 + 2 * nset + ndel])
  local nxt = i + 6 + 2 * nset + ndel + 2 * nadd
  local cur = redis.pcall('HGET', key, 'h')
  if type(cur) == 'table' and cur.err then
    out[k] = cur.err
  else
    if cur == false then cur = '' end
    if cur ~= ARGV[i] then
      out[k] = 0
    else
      local a = {'h', ARGV[i + 1]}
      local j = i + 4
      for _ = 1, nset do
        a[#a + 1] = ARGV[j]; a[#a + 1] = ARGV[j + 1]; j = j + 2
        if #a >= chunk then redis.call('HSET', key, unpack(a)); a = {} end
      end
      if #a > 0 then redis.call('HSET', key, unpack(a)) end
      j = j + 1
      a = {}
      for _ = 1, ndel do
        a[#a + 1] = ARGV[j]; j = j + 1
        if #a >= chunk then redis.call('HDEL', key, unpack(a)); a = {} end
      end
      if #a > 0 then redis.call('HDEL', key, unpack(a)) end
      j = j + 1
      for _ = 1, nadd do
        if redis.call('HINCRBY', key, ARGV[j], ARGV[j + 1]) <= 0 then redis.call('HDEL', key, ARGV[j]) end
        j = j + 2
      end
      if ARGV[i + 2] ~= '0' then redis.call('PEXPIRE', key, ARGV[i + 2]) end
      out[k] = 1
    end
  end
  i = nxt
end
return out`)

// Redis is the Backend over a go-redis UniversalClient (single server, Sentinel or
// Cluster). Load is one pipeline of HMGET (and HSCAN). Swap is one EVALSHA of the
// CAS script per op on a Cluster, pipelined (a ClusterClient splits the pipeline per
// node); on one server, the ops of concurrent Swaps go in one EVALSHA over all their
// keys (swapBatch).
type Redis struct {
	c redis.UniversalClient
	// cluster: the ops cannot share a script call (their keys are in
	// different slots).
	cluster bool
	b       swapBatch
}

// NewRedis returns the Backend over c; the caller owns c.
func NewRedis(c redis.UniversalClient) *Redis {
	_, cluster := c.(*redis.ClusterClient)
	return &Redis{c: c, cluster: cluster}
}

// Load implements Backend.
func (r *Redis) Load(ctx context.Context, reads []Read) ([]Snapshot, error) {
	gets := make([]*redis.SliceCmd, len(reads))
	scans := make([]*redis.ScanCmd, len(reads))
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, rd := range reads {
			gets[i] = p.HMGet(ctx, rd.Key, append([]string{headerField}, rd.Fields...)...)
			if rd.Scan.Count > 0 {
				cur, _ := strconv.ParseUint(rd.Scan.Cursor, 10, 64)
				scans[i] = p.HScan(ctx, rd.Key, cur, "", int64(rd.Scan.Count))
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]Snapshot, len(reads))
	for i, g := range gets {
		vals, err := g.Result()
		if err != nil {
			return nil, err
		}
		out[i].Header = bytesOf(vals[0])
		out[i].Fields = make([][]byte, len(vals)-1)
		for j, v := range vals[1:] {
			out[i].Fields[j] = bytesOf(v)
		}
		if sc := scans[i]; sc != nil {
			kv, cur, err := sc.Result()
			if err != nil {
				return nil, err
			}
			for j := 0; j+1 < len(kv); j += 2 {
				out[i].Scanned = append(out[i].Scanned, Field{Name: kv[j], Value: []byte(kv[j+1])})
			}
			if cur != 0 {
				out[i].Cursor = strconv.FormatUint(cur, 10)
			}
		}
	}
	return out, nil
}

// bytesOf is an HMGET value: nil for an absent field.
func bytesOf(v any) []byte {
	if s, ok := v.(string); ok {
		return []byte(s)
	}
	return nil
}

// Swap implements Backend. On a Cluster it runs the CAS script by EVALSHA per op
// (swapEach); on one server it adds ops to the next script call of concurrent Swaps
// (swapBatch). An op the server cannot apply (its key is not a hash) fails the
// Swap with the server's error.
func (r *Redis) Swap(ctx context.Context, ops []Op) ([]bool, error) {
	if r.cluster {
		return r.swapEach(ctx, ops)
	}
	return r.b.swap(ctx, ops, r.swapAll)
}

// swapEach runs the CAS script once per op, in one pipeline, by EVALSHA and, for
// the ops a node answered NOSCRIPT (it had not cached the script, so the op was not
// applied), once more by EVAL.
func (r *Redis) swapEach(ctx context.Context, ops []Op) ([]bool, error) {
	out := make([]bool, len(ops))
	missing, err := r.swap(ctx, ops, out, nil, true)
	if err == nil && len(missing) > 0 {
		_, err = r.swap(ctx, ops, out, missing, false)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// swapAll runs the CAS script once over every op, by EVALSHA and, when the server
// answers NOSCRIPT (nothing was applied), by EVAL. It returns per op whether it was
// applied or the error of that op, or one error for all.
func (r *Redis) swapAll(ctx context.Context, ops []Op) ([]bool, []error, error) {
	keys := make([]string, len(ops))
	var args []any
	for i := range ops {
		keys[i] = ops[i].Key
		args = append(args, swapArgs(&ops[i])...)
	}
	res, err := casScript.EvalSha(ctx, r.c, keys, args...).Slice()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		res, err = casScript.Eval(ctx, r.c, keys, args...).Slice()
	}
	if err != nil {
		return nil, nil, err
	}
	if len(res) != len(ops) {
		return nil, nil, errors.New("quota: the CAS script answered " + strconv.Itoa(len(res)) + " results for " + strconv.Itoa(len(ops)) + " ops")
	}
	out := make([]bool, len(ops))
	errs := make([]error, len(ops))
	for i, v := range res {
		out[i], errs[i] = opResult(v)
	}
	return out, errs, nil
}

// opResult is the CAS script's result for one op: applied (1), not applied (0),
// or the error the server gave reading the key.
func opResult(v any) (bool, error) {
	switch v := v.(type) {
	case int64:
		return v == 1, nil
	case string:
		return false, errors.New(v)
	}
	return false, errors.New("quota: unexpected CAS script result")
}

// ttlArg is the CAS script's ARGV[3] for an Op's TTL: "0" for 0 (keep the
// key's expiry), else the milliseconds, at least 1.
func ttlArg(ttl time.Duration) string {
	if ttl == 0 {
		return "0"
	}
	return strconv.FormatInt(max(1, ttl.Milliseconds()), 10)
}

// swapArgs is the CAS script's ARGV for op.
func swapArgs(op *Op) []any {
	args := make([]any, 0, 6+2*len(op.Set)+len(op.Del)+2*len(op.Add))
	args = append(args, op.Old, op.New, ttlArg(op.TTL), len(op.Set))
	for _, f := range op.Set {
		args = append(args, f.Name, f.Value)
	}
	args = append(args, len(op.Del))
	for _, f := range op.Del {
		args = append(args, f)
	}
	args = append(args, len(op.Add))
	for _, d := range op.Add {
		args = append(args, d.Name, d.By)
	}
	return args
}

// swap runs the ops listed in only (all when nil) and records their results in out;
// it returns the ops answered NOSCRIPT.
func (r *Redis) swap(ctx context.Context, ops []Op, out []bool, only []int, sha bool) ([]int, error) {
	if only == nil {
		only = make([]int, len(ops))
		for i := range only {
			only[i] = i
		}
	}
	cmds := make([]*redis.Cmd, len(only))
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range only {
			args := swapArgs(&ops[i])
			if sha {
				cmds[j] = casScript.EvalSha(ctx, p, []string{ops[i].Key}, args...)
			} else {
				cmds[j] = casScript.Eval(ctx, p, []string{ops[i].Key}, args...)
			}
		}
		return nil
	})
	var missing []int
	for j, c := range cmds {
		res, e := c.Slice()
		if e != nil {
			if sha && strings.HasPrefix(e.Error(), "NOSCRIPT") {
				missing = append(missing, only[j])
				continue
			}
			return nil, e
		}
		if len(res) != 1 {
			return nil, errors.New("quota: unexpected CAS script result")
		}
		if out[only[j]], e = opResult(res[0]); e != nil {
			return nil, e
		}
	}
	if err != nil && len(missing) == 0 {
		return nil, err
	}
	return missing, nil
}

// TuneClient sets the options of a go-redis client used for quota so that an
// unreachable Redis fails a call at once instead of holding it: no command retries,
// one dial attempt, short dial and socket timeouts, and the request's context
// deadline applied to socket operations. Addresses, credentials and TLS are left
// as they are.
func TuneClient(o *redis.UniversalOptions) {
	o.MaxRetries = -1
	o.DialerRetries = 1
	o.DialTimeout = 200 * time.Millisecond
	o.ReadTimeout = 500 * time.Millisecond
	o.WriteTimeout = 500 * time.Millisecond
	o.ContextTimeoutEnabled = true
}
