package host

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Config describes one Envoy Wasm HTTP filter configuration: the module,
// its vm_config and plugin config, and the Envoy around it.
type Config struct {
	// Wasm is the module's binary (required).
	Wasm []byte
	// VMID is vm_config.vm_id: the shared-data and shared-queue namespace
	// (docs/ENVOY.md, Shared data) and the plugin_vm_id property.
	VMID string
	// PluginName is PluginConfig.name, the plugin_name property.
	PluginName string
	// RootID is PluginConfig.root_id, the plugin_root_id property.
	RootID string
	// NodeID is the bootstrap's node.id (Envoy's --service-node), served
	// as the property xds.node.id in every context (Envoy's attributes
	// doc: xds.node is the local node, known without a stream); empty
	// makes it NOT_FOUND.
	NodeID string
	// VMConfig is vm_config.configuration, buffer 6, readable only during
	// proxy_on_vm_start.
	VMConfig []byte
	// PluginConfig is PluginConfig.configuration, buffer 7, readable only
	// during proxy_on_configure.
	PluginConfig []byte
	// Env is vm_config.environment_variables, served by WASI environ_get
	// as "KEY=value" entries (sorted by key).
	Env map[string]string
	// Workers is the number of worker VMs (Envoy --concurrency); 0 means 1.
	Workers int
	// Clock drives the WASI wall clock, proxy_get_current_time_nanoseconds
	// and ticks; nil means SystemClock.
	Clock Clock
	// Clusters maps Envoy cluster names, the first argument of
	// proxy_http_call, to "host:port" addresses reached with plain HTTP.
	Clusters map[string]string
	// ClusterTLS maps cluster names to the TLS client configuration of their
	// connections (a cluster with an UpstreamTlsContext transport socket): calls
	// to them are HTTP/1.1 over TLS, kept alive like Envoy's connection pool.
	ClusterTLS map[string]*tls.Config
	// Profile selects Envoy's WASI behaviour; the zero value means
	// EnvoyPrePR533.
	Profile Profile
	// Logger receives every guest log line, with attributes worker,
	// context_id and source ("proxy_log", "stdout", "stderr"); nil
	// discards them (they are still returned in Response.Logs and by
	// Host.Logs).
	Logger *slog.Logger
	// LogLevel is the level proxy_get_log_level reports; proxy_log calls
	// below it are dropped, as Envoy's logger drops them. The zero value
	// is LogTrace (everything).
	LogLevel LogLevel
	// NoCanary skips Envoy's short-lived canary VM (CPPHOST
	// WasmHandleBase::canary), saving one instantiation.
	NoCanary bool
	// Trace records every callback into the guest and every hostcall out
	// of it; see Worker.Trace and Response.Trace.
	Trace bool
	// HTTPClient performs proxy_http_call requests; nil means a client of
	// its own (no timeout beyond the call's).
	HTTPClient *http.Client
	// ShareWith, if set, is another Host of the same process whose shared
	// data and shared queues this Host uses (one cas counter, one map per
	// vm_id), as two Wasm filter configurations in one Envoy share them
	// (CPPHOST src/shared_data.cc keeps one store per process). Closing
	// either Host leaves the store to the other.
	ShareWith *Host
	// SharedDataHook, if set, runs on a VM's event loop before each of its
	// proxy_get_shared_data ("get") and proxy_set_shared_data ("set")
	// hostcalls, with the VM's index (-1 for the canary), the callback the
	// guest is in (e.g. "proxy_on_http_call_response") and the key. A test
	// can block in it to hold that VM inside a callback while the other
	// VMs run; with a VirtualClock it must not block across an Advance,
	// which waits for every VM's tick.
	SharedDataHook func(worker int, callback, op, key string)
	// Rand, if set, is the source of WASI random_get for every VM of the
	// Host (reads are serialised); nil means crypto/rand. A seeded source
	// makes what the module draws (the Go runtime's seeds, a filter's hash
	// key) the same from run to run, so a run on a VirtualClock repeats.
	Rand io.Reader
	// InlineCallouts makes each proxy_http_call's request on the VM's loop,
	// while the calling callback waits, and delivers the answer right after
	// that callback returns (as a network of no latency would); a tick's
	// timer also waits for the answers of the calls the tick made, and of
	// the calls those answers made. Meant for HTTPClient transports that
	// answer in process: with a VirtualClock, a run's order of events then
	// depends on its inputs alone, whatever the worker count.
	InlineCallouts bool
}

// Host is a set of worker VMs of one module, as Envoy runs one Wasm HTTP
// filter configuration: a canary VM that runs the configuration and is
// discarded, then Config.Workers VMs that share shared data, queues and
// metrics. Each VM has its own goroutine (event loop); every call into a
// VM runs there, so a Host is safe for concurrent use.
type Host struct {
	cfg        Config
	profile    Profile
	clock      Clock
	logger     *slog.Logger
	rt         wazero.Runtime
	compiled   wazero.CompiledModule
	abi        string
	exports    map[string]api.FunctionDefinition
	client     *http.Client
	tlsClients map[string]*http.Client // per cluster of Config.ClusterTLS
	env        []string

	store   *sharedStore
	metrics *metricStore
	calls   importCounters // written only by instantiateImports
	entries importCounters // callbacks that entered the module; filled in New
	// allocName is the allocator export the host calls to place results:
	// "malloc" when exported, else "proxy_on_memory_allocate".
	allocName string

	workers []*vm

	logMu sync.Mutex
	logs  []LogEntry

	callCtx    context.Context
	callCancel context.CancelFunc
	callWG     sync.WaitGroup
	// pending counts callouts from dispatch until their answer has been
	// delivered on the VM's loop (WaitCallouts).
	pending sync.WaitGroup

	randMu sync.Mutex

	closeOnce sync.Once
}

// maxHostLogs bounds Host.Logs; older entries are dropped.
const maxHostLogs = 10000

// compilationCache is shared by every Host in the process, so that many
// tests compiling the same module pay wazero's compile (hundreds of ms)
// once.
var (
	compilationMu    sync.Mutex
	compilationCache = wazero.NewCompilationCache()
)

// UseCompilationCacheDir makes every Host created afterwards in this process
// keep wazero's compiled modules in dir as well as in memory, so that a
// later process running the same module on the same wazero skips compiling
// it (seconds for the sluice filter). Errors: dir cannot be created.
func UseCompilationCacheDir(dir string) error {
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return err
	}
	compilationMu.Lock()
	compilationCache = c
	compilationMu.Unlock()
	return nil
}

func currentCompilationCache() wazero.CompilationCache {
	compilationMu.Lock()
	defer compilationMu.Unlock()
	return compilationCache
}

// New compiles cfg.Wasm, runs the canary VM (unless cfg.NoCanary) and
// starts cfg.Workers worker VMs, each through _initialize,
// proxy_on_context_create(root, 0), proxy_on_vm_start and
// proxy_on_configure, as Envoy does (CPPHOST createWasm, canary,
// getOrCreateThreadLocalPlugin).
//
// # Errors
//
// ErrNoABIVersion for a module without an ABI marker; a *TrapError if
// _initialize or a start callback traps (e.g. a hostcall other than
// proxy_log from Go init()); ErrStartFailed or ErrConfigureFailed,
// wrapped with the VM and plugin name, if a start callback returns false.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if len(cfg.Wasm) == 0 {
		return nil, errors.New("host: Config.Wasm is empty")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	h := &Host{
		cfg:     cfg,
		profile: cfg.Profile.orDefault(),
		clock:   cfg.Clock,
		logger:  cfg.Logger,
		client:  cfg.HTTPClient,
		store:   newSharedStore(),
		metrics: newMetricStore(),
	}
	if cfg.ShareWith != nil {
		h.store = cfg.ShareWith.store
	}
	if h.clock == nil {
		h.clock = SystemClock
	}
	if h.logger == nil {
		h.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if h.client == nil {
		h.client = &http.Client{Transport: &http.Transport{}}
	}
	h.tlsClients = make(map[string]*http.Client, len(cfg.ClusterTLS))
	for name, tc := range cfg.ClusterTLS {
		h.tlsClients[name] = &http.Client{Transport: &http.Transport{TLSClientConfig: tc.Clone(), MaxIdleConnsPerHost: 64}}
	}
	h.env = sortedEnv(cfg.Env)
	h.callCtx, h.callCancel = context.WithCancel(context.Background())

	h.rt = wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithCompilationCache(currentCompilationCache()).
		WithCloseOnContextDone(false))
	compiled, err := h.rt.CompileModule(ctx, cfg.Wasm)
	if err != nil {
		h.rt.Close(ctx)
		return nil, fmt.Errorf("host: compile: %w", err)
	}
	h.compiled = compiled
	h.exports = compiled.ExportedFunctions()
	h.entries = importCounters{}
	for name := range h.exports {
		h.entries.counter(name)
	}
	// CPPHOST getFunctions: malloc is preferred over proxy_on_memory_allocate.
	h.allocName = "proxy_on_memory_allocate"
	if _, ok := h.exports["malloc"]; ok {
		h.allocName = "malloc"
	}
	// CPPHOST src/bytecode_util.cc getAbiVersion: the first marker found.
	for _, m := range []string{"proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0", "proxy_abi_version_0_1_0"} {
		if _, ok := h.exports[m]; ok {
			h.abi = m
			break
		}
	}
	if h.abi == "" {
		h.rt.Close(ctx)
		return nil, ErrNoABIVersion
	}
	if err := h.instantiateImports(ctx); err != nil {
		h.rt.Close(ctx)
		return nil, err
	}
	if !cfg.NoCanary {
		// CPPHOST WasmHandleBase::canary: a clone runs start and configure,
		// then is killed; its ticks never fire.
		c, err := h.startVM(ctx, -1)
		if err != nil {
			h.Close()
			return nil, err
		}
		c.close()
	}
	for i := 0; i < cfg.Workers; i++ {
		w, err := h.startVM(ctx, i)
		if err != nil {
			h.Close()
			return nil, err
		}
		h.workers = append(h.workers, w)
	}
	return h, nil
}

// Workers returns the number of worker VMs.
func (h *Host) Workers() int { return len(h.workers) }

// Worker returns worker i (0 ≤ i < Workers()); it panics if i is out of
// range.
func (h *Host) Worker(i int) *Worker { return &Worker{v: h.workers[i]} }

// ABIVersion returns the ABI marker the module exports, e.g.
// "proxy_abi_version_0_2_1".
func (h *Host) ABIVersion() string { return h.abi }

// Clock returns the Host's clock.
func (h *Host) Clock() Clock { return h.clock }

// SharedData returns the value and cas of key in the Host's vm_id
// namespace, as proxy_get_shared_data would; ok is false if the key was
// never set.
func (h *Host) SharedData(key string) (value []byte, cas uint32, ok bool) {
	return h.store.get(h.cfg.VMID, key)
}

// SharedDataKeys returns every key set in the Host's vm_id namespace,
// sorted: Envoy cannot delete a key, so this is every key ever written.
func (h *Host) SharedDataKeys() []string { return h.store.keys(h.cfg.VMID) }

// SetSharedData stores value under key unconditionally (cas 0 semantics),
// as if a guest had, and returns the new cas.
func (h *Host) SetSharedData(key string, value []byte) uint32 {
	cas, _ := h.store.set(h.cfg.VMID, key, value, 0)
	return cas
}

// Metric returns the metric name as the guest defined it (without
// Envoy's "wasmcustom." prefix, which is also accepted), aggregated over
// all VMs; ok is false if no VM defined it.
func (h *Host) Metric(name string) (Metric, bool) { return h.metrics.lookup(name) }

// MetricNames returns the name of every metric a VM defined, without Envoy's
// "wasmcustom." prefix, sorted.
func (h *Host) MetricNames() []string { return h.metrics.names() }

// Logs returns the last (up to 10000) log entries of every VM, oldest
// first.
func (h *Host) Logs() []LogEntry {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return append([]LogEntry(nil), h.logs...)
}

// Close shuts the VMs down as Envoy does (proxy_on_done then
// proxy_on_delete on each root context, CPPHOST WasmBase::startShutdown),
// cancels HTTP callouts in flight and frees the runtime. It is safe to
// call more than once.
func (h *Host) Close() error {
	h.closeOnce.Do(func() {
		for _, w := range h.workers {
			w.shutdown()
		}
		h.callCancel()
		h.callWG.Wait()
		for _, c := range h.tlsClients {
			c.CloseIdleConnections()
		}
		for _, w := range h.workers {
			w.close()
		}
		h.rt.Close(context.Background())
	})
	return nil
}

func (h *Host) addLog(e LogEntry, source string) {
	h.logMu.Lock()
	if len(h.logs) >= maxHostLogs {
		h.logs = append(h.logs[:0], h.logs[len(h.logs)-maxHostLogs/2:]...)
	}
	h.logs = append(h.logs, e)
	h.logMu.Unlock()
	lvl := slog.LevelInfo
	switch e.Level {
	case LogTrace:
		lvl = slog.LevelDebug - 4
	case LogDebug:
		lvl = slog.LevelDebug
	case LogWarn:
		lvl = slog.LevelWarn
	case LogError:
		lvl = slog.LevelError
	case LogCritical:
		lvl = slog.LevelError + 4
	}
	h.logger.LogAttrs(context.Background(), lvl, e.Message,
		slog.Int("worker", e.Worker), slog.Uint64("context_id", uint64(e.ContextID)), slog.String("source", source))
}

func randRead(b []byte) { _, _ = rand.Read(b) }

// randRead fills b from Config.Rand, else from crypto/rand.
func (h *Host) randRead(b []byte) {
	if h.cfg.Rand == nil {
		randRead(b)
		return
	}
	h.randMu.Lock()
	defer h.randMu.Unlock()
	if _, err := io.ReadFull(h.cfg.Rand, b); err != nil {
		randRead(b)
	}
}

// WaitCallouts returns when every proxy_http_call dispatched so far, and
// every call dispatched by the callbacks that deliver their answers, has
// been answered and delivered (proxy_on_http_call_response returned), or
// when ctx ends. With a VirtualClock, calling it after each Advance and
// each request makes a run's order of events depend on nothing but its
// inputs. It must not be called from a VM's event loop, nor while another
// goroutine may dispatch calls (a request in flight, an Advance).
func (h *Host) WaitCallouts(ctx context.Context) error {
	done := make(chan struct{})
	go func() { h.pending.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sortedEnv(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sortStrings(out)
	return out
}

var realStart = time.Now()

// monotonicNanos is the WASI monotonic clock: real time since process
// start, plus one second so it is never zero.
func monotonicNanos() uint64 { return uint64(time.Since(realStart)) + uint64(time.Second) }
