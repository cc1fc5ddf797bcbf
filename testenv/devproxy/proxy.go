package devproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// Options configure New. Only Config is required.
type Options struct {
	// Config is the Envoy configuration the proxy follows.
	Config *EnvoyConfig
	// Wasm is the filter module; nil runs the proxy without a filter
	// (pass-through), e.g. as a benchmark baseline.
	Wasm []byte
	// Workers is the number of worker VMs (Envoy --concurrency); 0 means 2.
	Workers int
	// Upstream overrides the address of the route's cluster, "host:port".
	Upstream string
	// Clusters override or add cluster addresses (name → "host:port").
	Clusters map[string]string
	// ReadToken, if not empty, is the control plane's read token: the VM's
	// environment variable that control_plane.token_env names gets it, or,
	// without token_env, it replaces control_plane.token in the plugin
	// configuration (a file with an inline placeholder).
	ReadToken string
	// Getenv is the proxy's own environment, which the VM's
	// vm_config.environment_variables.host_env_keys copy from, as Envoy copies
	// them from its process; nil reads the process environment.
	Getenv func(string) (string, bool)
	// NodeID, if not empty, overrides the file's node.id (Envoy's
	// --service-node): the filter's xds.node.id property.
	NodeID string
	// QuotaToken, if not empty, is the control plane's quota token, given as
	// ReadToken is (control_plane.quota_token_env, else quota_token).
	QuotaToken string
	// AccessLog receives the JSON access-log lines; nil writes none.
	AccessLog io.Writer
	// Logger receives the guest's logs and the proxy's own; nil discards.
	Logger *slog.Logger
	// LogLevel is the guest log level (Envoy's --component-log-level
	// wasm:...); the zero value is trace.
	LogLevel host.LogLevel
	// UpstreamTimeout is the route timeout; 0 means Envoy's default, 15s.
	UpstreamTimeout time.Duration
	// MaxBodyBytes bounds buffered request and response bodies; 0 means
	// 1 MiB + 64 KiB (above: 413 for a request, 503 for a response).
	MaxBodyBytes int64
}

// Proxy is the dev proxy's http.Handler: each request goes through the
// filter on one of the host's worker VMs (round robin) and on to the
// upstream, then back through the filter, and is logged.
type Proxy struct {
	o        Options
	h        *host.Host // nil: pass-through
	upstream string
	client   *http.Client
	format   *Format
	logMu    sync.Mutex
	next     atomic.Uint64
	log      *slog.Logger
	failOpen bool
	// localAddr is what Envoy appends to x-forwarded-for for a loopback
	// peer (envoyLocalAddress).
	localAddr netip.Addr
}

// New starts the filter's VMs (the canary, then Workers workers, each
// through on_vm_start and on_configure, as Envoy does) and returns the
// proxy.
//
// # Errors
//
// A plugin configuration the filter refuses (host.ErrConfigureFailed, the
// guest's log says why), an access-log format with an unsupported operator,
// or a missing upstream address.
func New(ctx context.Context, o Options) (*Proxy, error) {
	c := o.Config
	if c == nil {
		return nil, errors.New("devproxy: Options.Config is required")
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.UpstreamTimeout <= 0 {
		o.UpstreamTimeout = 15 * time.Second
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1<<20 + 64<<10
	}
	p := &Proxy{o: o, log: o.Logger, localAddr: envoyLocalAddress()}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	clusters := map[string]string{}
	for k, v := range c.Clusters {
		clusters[k] = v
	}
	for k, v := range o.Clusters {
		clusters[k] = v
	}
	if c.ClusterTLS[c.RouteCluster] != nil {
		return nil, fmt.Errorf("devproxy: the route's cluster %q has a TLS transport socket: the dev proxy forwards requests over plain HTTP only (TLS is for the filter's calls)", c.RouteCluster)
	}
	clusterTLS := map[string]*tls.Config{}
	for name, u := range c.ClusterTLS {
		tc, err := u.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("devproxy: cluster %s: %w", name, err)
		}
		clusterTLS[name] = tc
	}
	p.upstream = clusters[c.RouteCluster]
	if o.Upstream != "" {
		p.upstream = o.Upstream
	}
	if p.upstream == "" {
		return nil, fmt.Errorf("devproxy: no address for the route's cluster %q", c.RouteCluster)
	}
	if c.AccessLog != nil && o.AccessLog != nil {
		f, err := CompileFormat(c.AccessLog.JSONFormat, c.AccessLog.Formatters)
		if err != nil {
			return nil, fmt.Errorf("devproxy: access log: %w", err)
		}
		p.format = f
	}
	dialer := &net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}
	p.client = &http.Client{
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true, // pass accept-encoding and bodies through untouched
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if o.Wasm == nil || c.Filter == nil {
		return p, nil
	}
	f := c.Filter
	p.failOpen = f.FailOpen
	cfg := f.PluginConfig
	env := vmEnv(f, o.Getenv)
	for _, t := range []struct{ member, value string }{{"token", o.ReadToken}, {"quota_token", o.QuotaToken}} {
		if t.value == "" {
			continue
		}
		if name := controlPlaneMember(cfg, t.member+"_env"); name != "" {
			env[name] = t.value
			continue
		}
		var err error
		if cfg, err = withMember(cfg, t.member, t.value); err != nil {
			return nil, err
		}
	}
	nodeID := c.NodeID
	if o.NodeID != "" {
		nodeID = o.NodeID
	}
	h, err := host.New(ctx, host.Config{
		Wasm: o.Wasm, VMID: f.VMID, PluginName: f.Name, RootID: f.RootID, NodeID: nodeID,
		VMConfig: f.VMConfig, PluginConfig: cfg, Env: env,
		Workers: o.Workers, Clock: host.SystemClock, Clusters: clusters, ClusterTLS: clusterTLS,
		Logger: o.Logger, LogLevel: o.LogLevel,
	})
	if err != nil {
		return nil, fmt.Errorf("devproxy: starting the filter: %w", err)
	}
	p.h = h
	return p, nil
}

// vmEnv is the VM's environment as Envoy builds it from
// vm_config.environment_variables: each host_env_keys variable set in the
// proxy's environment, then key_values.
func vmEnv(f *WasmFilter, getenv func(string) (string, bool)) map[string]string {
	if getenv == nil {
		getenv = os.LookupEnv
	}
	env := map[string]string{}
	for _, k := range f.HostEnvKeys {
		if v, ok := getenv(k); ok {
			env[k] = v
		}
	}
	maps.Copy(env, f.Env)
	return env
}

// controlPlaneMember is control_plane.<name> of a JSON plugin configuration
// when it is a string, else "".
func controlPlaneMember(cfg []byte, name string) string {
	var doc struct {
		ControlPlane map[string]any `json:"control_plane"`
	}
	if json.Unmarshal(cfg, &doc) != nil {
		return ""
	}
	v, _ := doc.ControlPlane[name].(string)
	return v
}

// withMember sets control_plane.<name> in a JSON plugin configuration.
func withMember(cfg []byte, name, token string) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(cfg))
	d.UseNumber()
	var doc map[string]any
	if err := d.Decode(&doc); err != nil {
		return nil, fmt.Errorf("devproxy: setting the read token: the plugin configuration is not a JSON object: %v", err)
	}
	cp, ok := doc["control_plane"].(map[string]any)
	if !ok {
		return nil, errors.New("devproxy: a read token was given but the plugin configuration has no control_plane section")
	}
	cp[name] = token
	return json.Marshal(doc)
}

// Host returns the filter's host, or nil in pass-through mode.
func (p *Proxy) Host() *host.Host { return p.h }

// Upstream returns the upstream address requests are forwarded to.
func (p *Proxy) Upstream() string { return p.upstream }

// Close stops the VMs (proxy_on_done, proxy_on_delete) and idle upstream
// connections.
func (p *Proxy) Close() error {
	p.client.CloseIdleConnections()
	if p.h != nil {
		return p.h.Close()
	}
	return nil
}

// Hop-by-hop headers, which Envoy's HTTP/1 codec does not pass to filters
// or upstream (RFC 9110 §7.6.1).
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "te": true, "trailer": true}

// stream is one request's state in ServeHTTP.
type stream struct {
	p     *Proxy
	s     *host.Stream // nil: no filter (pass-through or failed open)
	entry LogEntry
}

// ServeHTTP runs one request the way Envoy's HTTP connection manager would
// with the configured filter chain: wasm filter, router.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := &stream{p: p}
	e := &st.entry
	e.Start = time.Now()
	e.Protocol = r.Proto
	e.Remote = r.RemoteAddr
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		e.Local = a.String()
	}
	defer p.writeLog(st)

	body, err := io.ReadAll(io.LimitReader(r.Body, p.o.MaxBodyBytes+1))
	if err != nil {
		e.Flags = "DC" // the client went away while sending
		return
	}
	e.BytesReceived = int64(len(body))
	if int64(len(body)) > p.o.MaxBodyBytes {
		st.reply(w, host.LocalReply{Status: http.StatusRequestEntityTooLarge, Body: []byte("Payload Too Large"), Details: "request_payload_too_large"})
		return
	}
	req, remote := p.requestHeaders(r)
	e.Remote = remote // %DOWNSTREAM_REMOTE_ADDRESS%: the trusted client address
	e.RequestHeaders = req
	bg := context.WithoutCancel(r.Context())

	if p.h != nil {
		wk := p.h.Worker(int(p.next.Add(1)-1) % p.h.Workers())
		if wk.Failed() != nil {
			if !p.failOpen {
				st.reply(w, host.LocalReply{Status: http.StatusServiceUnavailable, Details: "wasm_fail_stream"})
				return
			}
		} else if s, err := wk.NewStream(host.StreamInfo{SourceAddress: e.Remote, DestinationAddress: e.Local, Protocol: r.Proto}); err == nil {
			st.s = s
			defer func() {
				if err := s.Finish(bg); err != nil {
					p.log.Warn("devproxy: finishing a stream", "err", err)
				}
				e.FilterState = s.FilterState()
			}()
		}
	}
	if st.s != nil {
		done, ok := st.requestPhase(w, r, req, body)
		if done {
			return
		}
		if ok {
			req = st.s.RequestHeaderMap()
			e.RequestHeaders = req
			body = st.s.ForwardedRequestBody()
		} else {
			st.s = nil // failed open: no more filter calls
		}
	}

	resp := p.forward(r.Context(), req, body, e)
	if r.Context().Err() != nil { // the client reset the stream
		e.Flags, e.ResponseCode = "DC", 0
		return
	}
	st.respond(w, r, resp)
}

// requestHeaders builds Envoy's request header map from r: pseudo-headers
// first, lower-case keys, hop-by-hop headers dropped, x-forwarded-for and
// x-request-id as the HCM sets them. remote is the trusted client address
// the HCM computes, "ip:port" (source.address).
func (p *Proxy) requestHeaders(r *http.Request) (h host.Headers, remote string) {
	c := p.o.Config
	h = host.Headers{{":method", r.Method}, {":path", r.URL.RequestURI()}, {":authority", r.Host}, {":scheme", "http"}}
	var reqID string
	var xffs []string
	for k, vs := range r.Header {
		k = strings.ToLower(k)
		if hopByHop[k] || k == "host" {
			continue
		}
		if k == "x-forwarded-for" {
			xffs = append(xffs, vs...)
			continue
		}
		for _, v := range vs {
			if k == "x-request-id" {
				if reqID == "" {
					reqID = v
				}
				continue
			}
			h = append(h, [2]string{k, v})
		}
	}
	// The trusted client address and x-forwarded-for
	// (config_http_conn_man_headers_x-forwarded-for; see trustedClient).
	remote = r.RemoteAddr
	if peer, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		xff, hasXFF := strings.Join(xffs, ","), len(xffs) > 0
		final, out, outHas := c.trustedClient(netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()), xff, hasXFF, p.localAddr)
		remote = final.String()
		if outHas {
			h = append(h, [2]string{"x-forwarded-for", out})
		}
	} else if len(xffs) > 0 {
		h = append(h, [2]string{"x-forwarded-for", strings.Join(xffs, ",")})
	}
	if c.UseRemoteAddress {
		h = setHeader(h, "x-forwarded-proto", "http")
		// An edge request (use_remote_address, and the client not internal:
		// Envoy's internal_address_config is empty by default) carries the
		// trusted client address in x-envoy-external-address, set before any
		// filter runs (source/common/http/conn_manager_utility.cc,
		// mutateRequestHeaders).
		if ap, err := netip.ParseAddrPort(remote); err == nil {
			h = setHeader(h, "x-envoy-external-address", ap.Addr().String())
		}
	}
	// config_http_conn_man_headers_x-request-id: an edge Envoy replaces an
	// external id unless preserve_external_request_id; it generates one
	// when there is none (generate_request_id, default true).
	if reqID != "" && (c.PreserveRequestID || !c.UseRemoteAddress) {
		h = append(h, [2]string{"x-request-id", reqID})
	} else if c.GenerateRequestID {
		h = append(h, [2]string{"x-request-id", uuid4()})
	}
	return h, remote
}

// requestPhase runs the request through the filter. done means the
// response was written (a local reply or a reset); ok false means the VM
// failed and the proxy fails open.
func (st *stream) requestPhase(w http.ResponseWriter, r *http.Request, req host.Headers, body []byte) (done, ok bool) {
	ctx := r.Context()
	status, err := st.s.RequestHeaders(ctx, req, len(body) == 0)
	if err == nil && status == host.Paused {
		status, err = st.s.Wait(ctx)
	}
	if err == nil && status == host.Continue && len(body) > 0 {
		status, err = st.s.RequestBody(ctx, body, true)
		if err == nil && status == host.Paused {
			status, err = st.s.Wait(ctx)
		}
	}
	return st.after(w, ctx, status, err)
}

// after handles a phase's outcome; see requestPhase.
func (st *stream) after(w http.ResponseWriter, ctx context.Context, status host.Status, err error) (done, ok bool) {
	switch {
	case ctx.Err() != nil: // the client went away while the filter held the request
		st.entry.Flags, st.entry.ResponseCode = "DC", 0
		return true, false
	case err != nil:
		st.p.log.Warn("devproxy: filter", "err", err)
		// Fail-open bypasses a VM that failed before this call; the call
		// that trapped fails its own stream (503 wasm_fail_stream) whatever
		// the policy, as Envoy does (docs/ENVOY.md, Lifecycle: "A failed VM").
		var trap *host.TrapError
		if errors.Is(err, host.ErrVMFailed) && !errors.As(err, &trap) && st.p.failOpen {
			return false, false
		}
		st.reply(w, host.LocalReply{Status: http.StatusServiceUnavailable, Details: "wasm_fail_stream"})
		return true, false
	case status == host.Replied:
		st.reply(w, *st.s.LocalReply())
		return true, true
	case status == host.Reset:
		st.reset(w)
		return true, true
	}
	return false, true
}

// reply writes a local reply (Envoy sendLocalReply: the filter's headers,
// content-type text/plain when there is a body and none was set).
func (st *stream) reply(w http.ResponseWriter, lr host.LocalReply) {
	h := lr.Headers.Clone()
	if len(lr.Body) > 0 && indexOf(h, "content-type") < 0 {
		h = append(h, [2]string{"content-type", "text/plain"})
	}
	st.entry.Details = lr.Details
	st.write(w, lr.Status, h, lr.Body)
}

// reset closes the client connection without a response, as Envoy resets
// the stream (proxy_close_stream; HTTP/1.1 has no stream reset).
func (st *stream) reset(w http.ResponseWriter) {
	st.entry.ResponseCode, st.entry.Details = 0, "wasm_close_stream"
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// upstreamResponse is what the router got: a response, or Envoy's local
// reply for an upstream failure.
type upstreamResponse struct {
	status  int
	headers host.Headers
	body    []byte
}

// forward sends the request to the upstream as Envoy's router would. An
// upstream failure becomes the response Envoy's router sends itself
// (503 "upstream connect error or disconnect/reset before headers. reset
// reason: ...", 504 "upstream request timeout"), which still passes the
// filter's response phase, as in Envoy.
func (p *Proxy) forward(ctx context.Context, req host.Headers, body []byte, e *LogEntry) upstreamResponse {
	ctx, cancel := context.WithTimeout(ctx, p.o.UpstreamTimeout)
	defer cancel()
	e.UpstreamCluster = p.o.Config.RouteCluster
	e.UpstreamHost = p.upstream
	start := time.Now()
	out, err := http.NewRequestWithContext(ctx, req.Get(":method"), "http://"+p.upstream+req.Get(":path"), bytes.NewReader(body))
	if err != nil {
		return p.routerReply(e, http.StatusBadRequest, "Bad Request", "invalid_request", "")
	}
	out.Host = req.Get(":authority")
	out.ContentLength = int64(len(body))
	for _, kv := range req {
		if !strings.HasPrefix(kv[0], ":") && kv[0] != "content-length" {
			out.Header.Add(kv[0], kv[1])
		}
	}
	// The router tells the upstream how long it will wait
	// (source/common/router/router.cc, FilterUtility::setTimeoutHeaders).
	out.Header.Set("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(p.o.UpstreamTimeout.Milliseconds(), 10))
	resp, err := p.client.Do(out)
	if err != nil {
		var ne net.Error
		var oe *net.OpError
		switch {
		case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout() && !(errors.As(err, &oe) && oe.Op == "dial")):
			return p.routerReply(e, http.StatusGatewayTimeout, "upstream request timeout", "response_timeout", "UT")
		case errors.As(err, &oe) && oe.Op == "dial":
			return p.routerReply(e, http.StatusServiceUnavailable,
				"upstream connect error or disconnect/reset before headers. reset reason: connection failure",
				"upstream_reset_before_response_started{connection_failure}", "UF")
		default:
			return p.routerReply(e, http.StatusServiceUnavailable,
				"upstream connect error or disconnect/reset before headers. reset reason: connection termination",
				"upstream_reset_before_response_started{connection_termination}", "UC")
		}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, p.o.MaxBodyBytes+1))
	if err != nil || int64(len(rb)) > p.o.MaxBodyBytes {
		return p.routerReply(e, http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
			"upstream_reset_after_response_started{connection_termination}", "UC")
	}
	h := host.Headers{{":status", strconv.Itoa(resp.StatusCode)}}
	for k, vs := range resp.Header {
		k = strings.ToLower(k)
		if hopByHop[k] {
			continue
		}
		for _, v := range vs {
			h = append(h, [2]string{k, v})
		}
	}
	// The router adds the upstream's time (config_http_filters_router_x-envoy-upstream-service-time).
	h = setHeader(h, "x-envoy-upstream-service-time", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	e.Details = "via_upstream"
	return upstreamResponse{status: resp.StatusCode, headers: h, body: rb}
}

func (p *Proxy) routerReply(e *LogEntry, status int, body, details, flags string) upstreamResponse {
	e.Details, e.Flags = details, flags
	return upstreamResponse{status: status, body: []byte(body),
		headers: host.Headers{{":status", strconv.Itoa(status)}, {"content-length", strconv.Itoa(len(body))}, {"content-type", "text/plain"}}}
}

// respond runs the response through the filter and writes it.
func (st *stream) respond(w http.ResponseWriter, r *http.Request, u upstreamResponse) {
	if st.s == nil {
		st.write(w, u.status, u.headers, u.body)
		return
	}
	ctx := r.Context()
	status, err := st.s.ResponseHeaders(ctx, u.headers, len(u.body) == 0)
	if err == nil && status == host.Paused {
		status, err = st.s.Wait(ctx)
	}
	if err == nil && status == host.Continue && len(u.body) > 0 {
		status, err = st.s.ResponseBody(ctx, u.body, true)
		if err == nil && status == host.Paused {
			status, err = st.s.Wait(ctx)
		}
	}
	if done, ok := st.after(w, ctx, status, err); done {
		return
	} else if !ok { // failed open
		st.write(w, u.status, u.headers, u.body)
		return
	}
	h := st.s.ResponseHeaderMap()
	code := u.status
	if v, err := strconv.Atoi(h.Get(":status")); err == nil {
		code = v
	}
	b := u.body
	if len(b) > 0 {
		b = st.s.ForwardedResponseBody()
	}
	st.write(w, code, h, b)
}

// write sends a response downstream.
func (st *stream) write(w http.ResponseWriter, code int, h host.Headers, body []byte) {
	wh := w.Header()
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] || kv[0] == "content-length" {
			continue
		}
		wh.Add(kv[0], kv[1])
	}
	wh.Set("Content-Length", strconv.Itoa(len(body)))
	wh.Set("Server", "envoy") // server_header_transformation OVERWRITE, the default
	w.WriteHeader(code)
	n, _ := w.Write(body)
	st.entry.ResponseCode = code
	st.entry.BytesSent = int64(n)
	rh := host.Headers{{":status", strconv.Itoa(code)}}
	for k, vs := range wh {
		for _, v := range vs {
			rh = append(rh, [2]string{strings.ToLower(k), v})
		}
	}
	st.entry.ResponseHeaders = rh
}

// writeLog writes the access-log line of a finished stream. It runs after
// the filter's on_log (deferred calls run last-in first-out).
func (p *Proxy) writeLog(st *stream) {
	if p.format == nil {
		return
	}
	st.entry.Duration = time.Since(st.entry.Start)
	line := p.format.Line(&st.entry)
	p.logMu.Lock()
	defer p.logMu.Unlock()
	if _, err := p.o.AccessLog.Write(line); err != nil {
		p.log.Warn("devproxy: writing the access log", "err", err)
	}
}

func indexOf(h host.Headers, k string) int {
	for i, kv := range h {
		if kv[0] == k {
			return i
		}
	}
	return -1
}

func setHeader(h host.Headers, k, v string) host.Headers {
	if i := indexOf(h, k); i >= 0 {
		h[i][1] = v
		return h
	}
	return append(h, [2]string{k, v})
}

// uuid4 returns a random RFC 9562 version-4 UUID, as Envoy's UUID request-id
// extension generates.
func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hx = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hx[c>>4], hx[c&0xf])
	}
	return string(out)
}
