// Package redisstore is the store.Store on Redis (go-redis v9 universal
// client: a single node, Sentinel or Cluster). Several control-plane replicas
// on one Redis behave as one service: every commit is one Lua script, and
// every commit publishes a change notice that all replicas receive.
//
// # Key layout
//
// The policy name is a Cluster hash tag, so one policy's keys share a slot
// and the commit script is legal on Cluster:
//
//	sluice:policy:{<name>}:doc      string: canonical policy JSON; absent when deleted
//	sluice:policy:{<name>}:version  string: decimal version counter (survives deletion)
//	sluice:policy:{<name>}:history  list: store.MarshalEntry JSON, newest first,
//	                                capped with LTRIM to the history depth; a
//	                                deletion empties it first (only the deletion
//	                                stays, so deleted policies keep no documents)
//	sluice:policy:{<name>}:writeid  string: Change.ID of the last commit
//	sluice:policy:{<name>}:epoch    string: the policy's epoch (store.NewEpoch),
//	                                set by the first commit that finds none
//	sluice:policies                 set: names of the live policies
//	channel sluice:changes          PUBLISH "<name> <version> <epoch>" after each
//	                                commit and each Rotate
//
// # Atomicity and acknowledgement
//
// The commit script checks the expected version, stores or deletes the
// document, bumps the version, appends to the capped history, updates the
// set of names and publishes the notice, all atomically. Commit returns only
// after Redis replied to the script; a retried script whose first attempt
// landed is recognised by its write id. On Cluster the set of names lives in
// another slot, so it is updated right after the script instead (SADD/SREM
// are idempotent; a crash between the two leaves the set stale until the
// next write of that policy).
//
// # Epochs
//
// The epoch key lives in the policy's hash slot and is written by the same
// script as the version, so whatever loses the version (a restart without
// persistence, FLUSHALL, a new empty node) loses the epoch too, and the next
// commit draws a new one: the versions that start again at 1 are told apart
// from the lost ones. A failover to a replica that missed the last writes
// keeps the old epoch with a lower version; package snapshot notices that
// (it saw the higher version) and calls Rotate. See store "Epochs".
//
// # Notices
//
// One pub/sub connection per Store feeds its subscribers. Every time the
// subscription is (re)established a resync event is delivered, because
// notices published while disconnected are lost; the snapshot layer then
// re-reads all versions (and polls them periodically as a safety net).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// Channel is the pub/sub channel carrying change notices ("<name> <version> <epoch>").
const Channel = "sluice:changes"

// SetKey is the set of live policy names.
const SetKey = "sluice:policies"

func docKey(name string) string     { return "sluice:policy:{" + name + "}:doc" }
func versionKey(name string) string { return "sluice:policy:{" + name + "}:version" }
func historyKey(name string) string { return "sluice:policy:{" + name + "}:history" }
func writeIDKey(name string) string { return "sluice:policy:{" + name + "}:writeid" }
func epochKey(name string) string   { return "sluice:policy:{" + name + "}:epoch" }

// commitScript: KEYS = doc, version, history, writeid, epoch[, set];
// ARGV = base, doc ("" deletes), entry, name, depth, write id, channel,
// a fresh epoch to use if the policy has none.
// Returns {1, version, epoch} on success, {0, current} on a version conflict.
var commitScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
local base = tonumber(ARGV[1])
local epoch = redis.call('GET', KEYS[5])
if cur ~= base then
  if ARGV[6] ~= '' and cur == base + 1 and redis.call('GET', KEYS[4]) == ARGV[6] then
    return {1, cur, epoch or ''}
  end
  return {0, cur}
end
if not epoch then
  epoch = ARGV[8]
  redis.call('SET', KEYS[5], epoch)
end
local new = cur + 1
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1], KEYS[3])
  if KEYS[6] then redis.call('SREM', KEYS[6], ARGV[4]) end
else
  redis.call('SET', KEYS[1], ARGV[2])
  if KEYS[6] then redis.call('SADD', KEYS[6], ARGV[4]) end
end
redis.call('SET', KEYS[2], new)
redis.call('SET', KEYS[4], ARGV[6])
redis.call('LPUSH', KEYS[3], ARGV[3])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
redis.call('PUBLISH', ARGV[7], ARGV[4] .. ' ' .. new .. ' ' .. epoch)
return {1, new, epoch}
`)

// rotateScript: KEYS = doc, version, epoch; ARGV = expected epoch ("" for
// none), new epoch, channel, name. If the policy was ever written and its
// epoch is the expected one, it sets the new epoch and publishes a notice.
// Returns MGET doc, version, epoch.
var rotateScript = redis.NewScript(`
local v = redis.call('GET', KEYS[2])
if v and (redis.call('GET', KEYS[3]) or '') == ARGV[1] then
  redis.call('SET', KEYS[3], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' ' .. v .. ' ' .. ARGV[2])
end
return redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
`)

// Options configure Open.
type Options struct {
	// URL is a redis:// or rediss:// URL, or a comma-separated list of
	// host:port addresses or URLs (credentials, database and TLS are taken
	// from the first URL). With MasterName the addresses are Sentinels; else
	// several addresses mean a Cluster; else one node.
	URL string
	// MasterName selects Sentinel mode: the name of the monitored master.
	MasterName string
	// HistoryDepth is how many history entries are kept per policy (≥ 1).
	HistoryDepth int
	// OpTimeout bounds each Redis command (dial, read, write); 0 means 2s.
	OpTimeout time.Duration
	// WaitReplicas, if above 0, makes every commit wait (Redis WAIT,
	// https://redis.io/docs/latest/commands/wait/) until that many replicas
	// acknowledged it, at most WaitTimeout; a commit fewer replicas
	// confirmed is reported as an error (not acknowledged), though the
	// master applied it. Not supported on Cluster (Open fails).
	WaitReplicas int
	// WaitTimeout bounds the WAIT of a commit; 0 means 1s. It must be below
	// OpTimeout, which bounds the reply.
	WaitTimeout time.Duration
}

// UniversalOptions turns o into go-redis options (exported for tests and
// the configuration check).
func (o Options) UniversalOptions() (*redis.UniversalOptions, error) {
	if strings.TrimSpace(o.URL) == "" {
		return nil, errors.New("redisstore: empty Redis URL")
	}
	u := &redis.UniversalOptions{MasterName: o.MasterName}
	first := true
	for _, part := range strings.Split(o.URL, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if strings.Contains(part, "://") {
			opt, err := redis.ParseURL(part)
			if err != nil {
				return nil, fmt.Errorf("redisstore: Redis URL %q: %s", redactURL(part), redactError(part, err))
			}
			if first {
				u.Username, u.Password, u.DB, u.TLSConfig = opt.Username, opt.Password, opt.DB, opt.TLSConfig
			}
			part = opt.Addr
		} else if strings.Contains(part, "@") {
			return nil, fmt.Errorf("redisstore: Redis address %q: credentials need a redis:// or rediss:// URL", redactURL(part))
		} else if _, port, err := net.SplitHostPort(part); err != nil || !validPort(port) {
			return nil, fmt.Errorf("redisstore: Redis address %q: want host:port or a redis:// URL", part)
		}
		first = false
		u.Addrs = append(u.Addrs, part)
	}
	if len(u.Addrs) == 0 {
		return nil, errors.New("redisstore: no Redis address")
	}
	timeout := o.OpTimeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	u.DialTimeout, u.ReadTimeout, u.WriteTimeout = timeout, timeout, timeout
	u.MaxRetries = 1
	u.DialerRetries = 1 // fail fast when Redis is down: writes answer 503, reads use the snapshot
	u.ClientName = "sluice-controlplane"
	return u, nil
}

// SetLogger routes go-redis's internal log lines (connection failures and
// the like, which it otherwise prints to stderr) to l at debug level. It is
// process-wide, as go-redis's logger is.
func SetLogger(l *slog.Logger) { redis.SetLogger(slogAdapter{l}) }

type slogAdapter struct{ l *slog.Logger }

// Printf implements go-redis's internal.Logging.
func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	a.l.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// redactURL replaces the userinfo of a URL, or of an address written
// user:password@host, with *** for error messages.
func redactURL(s string) string {
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + 3
	}
	if j := strings.LastIndex(s, "@"); j >= start {
		return s[:start] + "***@" + s[j+1:]
	}
	return s
}

// redactError returns the message of err, an error about the URL u, without
// u's userinfo: net/url's errors quote the whole URL, so only their cause is
// kept, and any remaining copy of the userinfo (raw or decoded) is replaced.
func redactError(u string, err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	start := 0
	if i := strings.Index(u, "://"); i >= 0 {
		start = i + 3
	}
	if j := strings.LastIndex(u, "@"); j >= start {
		info := u[start:j]
		msg = strings.ReplaceAll(msg, info, "***")
		if dec, derr := url.PathUnescape(info); derr == nil && dec != "" {
			msg = strings.ReplaceAll(msg, dec, "***")
		}
		if _, pw, ok := strings.Cut(info, ":"); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "***")
		}
	}
	return msg
}

func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && n > 0
}

// Store is the Redis-backed store.Store.
type Store struct {
	client  redis.UniversalClient
	depth   int
	cluster bool
	wait    int   // WaitReplicas
	waitMs  int64 // WaitTimeout in milliseconds

	store.Fanout
	subOnce sync.Once
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}

	closeOnce sync.Once
}

var _ store.Store = (*Store)(nil)

// Open connects lazily: it does not fail when Redis is down (the control
// plane starts unready and recovers), only on bad options.
func Open(o Options) (*Store, error) {
	if o.HistoryDepth < 1 {
		return nil, fmt.Errorf("redisstore: history depth %d, want ≥ 1", o.HistoryDepth)
	}
	uo, err := o.UniversalOptions()
	if err != nil {
		return nil, err
	}
	if o.WaitReplicas < 0 {
		return nil, fmt.Errorf("redisstore: wait replicas %d, want ≥ 0", o.WaitReplicas)
	}
	if o.WaitTimeout == 0 {
		o.WaitTimeout = time.Second
	}
	if o.WaitReplicas > 0 && (o.WaitTimeout < time.Millisecond || o.WaitTimeout >= uo.ReadTimeout) {
		return nil, fmt.Errorf("redisstore: wait timeout %s, want 1ms to below the operation timeout %s", o.WaitTimeout, uo.ReadTimeout)
	}
	client := redis.NewUniversalClient(uo)
	_, cluster := client.(*redis.ClusterClient)
	if cluster && o.WaitReplicas > 0 {
		client.Close()
		return nil, errors.New("redisstore: waiting for replicas (WAIT) is not supported on Redis Cluster")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Store{client: client, depth: o.HistoryDepth, cluster: cluster, wait: o.WaitReplicas, waitMs: o.WaitTimeout.Milliseconds(),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}, nil
}

func (s *Store) wrap(op string, err error) error {
	if errors.Is(err, redis.ErrClosed) || s.ctx.Err() != nil {
		return store.ErrClosed
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, name string) (store.Record, error) {
	vals, err := s.client.MGet(ctx, docKey(name), versionKey(name), epochKey(name)).Result()
	if err != nil {
		return store.Record{}, s.wrap("get "+name, err)
	}
	return record(name, vals)
}

// record builds a Record from the values of the doc, version and epoch keys.
func record(name string, vals []any) (store.Record, error) {
	if len(vals) != 3 {
		return store.Record{}, fmt.Errorf("redisstore: get %s: %d values, want 3", name, len(vals))
	}
	r := store.Record{Name: name}
	if d, ok := vals[0].(string); ok {
		r.Doc = []byte(d)
		r.Sum = store.Sum(r.Doc)
	}
	if v, ok := vals[1].(string); ok {
		var err error
		if r.Version, err = strconv.ParseUint(v, 10, 64); err != nil {
			return store.Record{}, fmt.Errorf("redisstore: get %s: bad version %q", name, v)
		}
	}
	if e, ok := vals[2].(string); ok && r.Version > 0 {
		r.Epoch = e
	}
	return r, nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context) ([]store.Record, error) {
	names, err := s.client.SMembers(ctx, SetKey).Result()
	if err != nil {
		return nil, s.wrap("list", err)
	}
	sort.Strings(names)
	cmds := make([]*redis.StringCmd, len(names))
	epochs := make([]*redis.StringCmd, len(names))
	_, err = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			cmds[i] = p.Get(ctx, versionKey(n))
			epochs[i] = p.Get(ctx, epochKey(n))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, s.wrap("list", err)
	}
	out := make([]store.Record, 0, len(names))
	for i, n := range names {
		v, err := cmds[i].Uint64()
		if err != nil {
			continue // stale set member
		}
		e, _ := epochs[i].Result() // "" when absent (written before epochs)
		out = append(out, store.Record{Name: n, Version: v, Epoch: e})
	}
	return out, nil
}

// Commit implements store.Store.
func (s *Store) Commit(ctx context.Context, c store.Change) (store.Record, error) {
	keys := []string{docKey(c.Name), versionKey(c.Name), historyKey(c.Name), writeIDKey(c.Name), epochKey(c.Name)}
	if !s.cluster {
		keys = append(keys, SetKey)
	}
	args := []any{c.Base, string(c.Doc), store.MarshalEntry(store.EntryOf(c, c.Base+1)), c.Name, s.depth, c.ID, Channel, store.NewEpoch()}
	var res []any
	var err error
	if s.wait == 0 {
		res, err = commitScript.Run(ctx, s.client, keys, args...).Slice()
	} else {
		res, err = s.commitAndWait(ctx, keys, args)
	}
	if err != nil {
		return store.Record{}, s.wrap("commit "+c.Name, err)
	}
	if len(res) > 0 && res[0] == int64(0) {
		return store.Record{}, store.ErrConflict
	}
	var (
		version int64
		epoch   string
		ok      = len(res) == 3 && res[0] == int64(1)
	)
	if ok {
		version, _ = res[1].(int64)
		epoch, ok = res[2].(string)
	}
	if !ok || version < 1 {
		return store.Record{}, fmt.Errorf("redisstore: commit %s: unexpected script reply %v", c.Name, res)
	}
	if s.cluster {
		// The commit itself is durable and acknowledged; a failure here only
		// leaves the set of names stale until this policy's next write.
		if c.Doc == nil {
			_ = s.client.SRem(ctx, SetKey, c.Name).Err()
		} else {
			_ = s.client.SAdd(ctx, SetKey, c.Name).Err()
		}
	}
	r := store.Record{Name: c.Name, Version: uint64(version), Doc: c.Doc, Sum: store.Sum(c.Doc), Epoch: epoch}
	// Tell this replica's subscribers at once. The pub/sub notice reaches the
	// other replicas; here it may be lost if the subscription is not confirmed
	// yet (SUBSCRIBE is asynchronous), and its echo is harmless: the fanout
	// keeps the highest version per name.
	s.Publish(store.Event{Name: r.Name, Version: r.Version, Epoch: r.Epoch})
	return r, nil
}

// Rotate implements store.Store.
func (s *Store) Rotate(ctx context.Context, name, from string) (store.Record, error) {
	vals, err := rotateScript.Run(ctx, s.client, []string{docKey(name), versionKey(name), epochKey(name)},
		from, store.NewEpoch(), Channel, name).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return store.Record{}, s.wrap("rotate "+name, err)
	}
	r, err := record(name, vals)
	if err != nil {
		return store.Record{}, err
	}
	s.Publish(store.Event{Name: r.Name, Version: r.Version, Epoch: r.Epoch})
	return r, nil
}

// errTooFewReplicas is wrapped by Commit when WAIT saw fewer replicas
// acknowledge the commit than Options.WaitReplicas.
var errTooFewReplicas = errors.New("fewer replicas than --redis-wait-replicas confirmed the write within the wait timeout")

// commitAndWait runs the commit script and WAIT in one pipeline, so both go
// over one connection: WAIT waits for that connection's writes. A version
// conflict (the script wrote nothing) is returned without judging WAIT.
func (s *Store) commitAndWait(ctx context.Context, keys []string, args []any) ([]any, error) {
	var script *redis.Cmd
	var wait *redis.Cmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		script = commitScript.Eval(ctx, p, keys, args...)
		wait = p.Do(ctx, "WAIT", s.wait, s.waitMs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	res, err := script.Slice()
	if err != nil {
		return nil, err
	}
	if len(res) > 0 && res[0] == int64(0) {
		return res, nil
	}
	n, err := wait.Int64()
	if err != nil {
		return nil, err
	}
	if n < int64(s.wait) {
		return nil, fmt.Errorf("%w (%d of %d)", errTooFewReplicas, n, s.wait)
	}
	return res, nil
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, name string) ([]store.HistoryEntry, error) {
	vals, err := s.client.LRange(ctx, historyKey(name), 0, int64(s.depth)-1).Result()
	if err != nil {
		return nil, s.wrap("history "+name, err)
	}
	out := make([]store.HistoryEntry, 0, len(vals))
	for _, v := range vals {
		e, err := store.UnmarshalEntry([]byte(v))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return s.wrap("ping", err)
	}
	return nil
}

// Subscribe implements store.Store. The first call starts the store's
// pub/sub connection.
func (s *Store) Subscribe(ctx context.Context) <-chan store.Event {
	s.subOnce.Do(func() { go s.listen() })
	return s.Fanout.Subscribe(ctx)
}

// listen keeps one subscription to Channel alive and forwards notices.
func (s *Store) listen() {
	defer close(s.done)
	ps := s.client.Subscribe(s.ctx, Channel)
	defer ps.Close()
	go func() { <-s.ctx.Done(); ps.Close() }()
	backoff := 50 * time.Millisecond
	for s.ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(s.ctx, 15*time.Second)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Idle: check the connection; a failed ping forces a reconnect.
				_ = ps.Ping(s.ctx)
				continue
			}
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.Publish(store.Event{}) // (re)subscribed: notices may have been missed
			}
		case *redis.Message:
			// "<name> <version> <epoch>", or "<name> <version>" from a
			// control plane that predates epochs.
			name, rest, ok := strings.Cut(m.Payload, " ")
			v, epoch, _ := strings.Cut(rest, " ")
			version, err := strconv.ParseUint(v, 10, 64)
			if !ok || err != nil || name == "" {
				continue
			}
			s.Publish(store.Event{Name: name, Version: version, Epoch: epoch})
		}
	}
}

// Close implements store.Store. Closing twice is harmless.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.cancel()
		started := true
		s.subOnce.Do(func() { started = false })
		if started {
			<-s.done
		}
		err = s.client.Close()
	})
	return err
}
