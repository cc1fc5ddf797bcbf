package quota

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Backend stores the quota values (limiter state and lease ledger) of counter keys.
// Every change is a compare-and-swap of one key's whole value, so any number of
// control-plane replicas may share one backend.
type Backend interface {
	// Load returns the current value of each key, nil for a key that has none. An
	// error means the backend could not answer; nothing may be granted then.
	Load(ctx context.Context, keys []string) ([][]byte, error)
	// Swap applies each op iff the key's value is still op.Old (nil: no value), and
	// reports per op whether it was applied. An error means the backend could not
	// answer for the batch: some ops may have been applied (each atomically).
	Swap(ctx context.Context, ops []Op) ([]bool, error)
}

// Op is one compare-and-swap: set Key to New with expiry TTL if its value is Old.
type Op struct {
	Key      string
	Old, New []byte
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
	val []byte
	exp time.Time
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

// Load implements Backend.
func (m *Memory) Load(ctx context.Context, keys []string) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([][]byte, len(keys))
	for i, k := range keys {
		if e, ok := m.m[k]; ok && now.Before(e.exp) {
			out[i] = e.val
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
		var cur []byte
		if e, ok := m.m[op.Key]; ok && now.Before(e.exp) {
			cur = e.val
		}
		if !bytes.Equal(cur, op.Old) {
			continue
		}
		if op.New != nil && cur == nil {
			if err := m.room(now); err != nil {
				return nil, err
			}
		}
		out[i] = true
		if op.New == nil {
			delete(m.m, op.Key)
		} else {
			m.m[op.Key] = memEntry{val: op.New, exp: now.Add(op.TTL)}
		}
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

// casScript sets KEYS[1] to ARGV[2] with PX ARGV[3] (or deletes it when ARGV[2] is
// empty) iff its value is ARGV[1] ("" meaning absent). It touches one key, so it runs
// on the Cluster node owning that key's slot.
var casScript = redis.NewScript(`local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1`)

// Redis is the Backend over a go-redis UniversalClient (single server, Sentinel or
// Cluster). A batch is two pipelines, GET then EVALSHA of the CAS script, which a
// ClusterClient splits per node.
type Redis struct {
	c redis.UniversalClient
}

// NewRedis returns the Backend over c; the caller owns c.
func NewRedis(c redis.UniversalClient) *Redis { return &Redis{c: c} }

// Load implements Backend.
func (r *Redis) Load(ctx context.Context, keys []string) ([][]byte, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([][]byte, len(keys))
	for i, c := range cmds {
		b, err := c.Bytes()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			out[i] = b
		}
	}
	return out, nil
}

// Swap implements Backend. It runs the CAS script by EVALSHA and, for the ops a node
// answered NOSCRIPT (it had not cached the script, so the op was not applied), once
// more by EVAL.
func (r *Redis) Swap(ctx context.Context, ops []Op) ([]bool, error) {
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
			op := ops[i]
			args := []any{op.Old, op.New, strconv.FormatInt(max(1, op.TTL.Milliseconds()), 10)}
			if sha {
				cmds[j] = casScript.EvalSha(ctx, p, []string{op.Key}, args...)
			} else {
				cmds[j] = casScript.Eval(ctx, p, []string{op.Key}, args...)
			}
		}
		return nil
	})
	var missing []int
	for j, c := range cmds {
		n, e := c.Int()
		if e != nil {
			if sha && strings.HasPrefix(e.Error(), "NOSCRIPT") {
				missing = append(missing, only[j])
				continue
			}
			return nil, e
		}
		out[only[j]] = n == 1
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
