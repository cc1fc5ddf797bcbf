package devproxy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	filev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	// Typed configs the bootstrap's Any fields may hold, registered so that
	// protojson resolves them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/cel/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/req_without_query/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/original_ip_detection/custom_header/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/original_ip_detection/xff/v3"
)

// Envoy extension names the dev proxy understands.
const (
	hcmName      = "envoy.filters.network.http_connection_manager"
	wasmName     = "envoy.filters.http.wasm"
	routerName   = "envoy.filters.http.router"
	fileLogName  = "envoy.access_loggers.file"
	stdoutLog    = "envoy.access_loggers.stdout"
	reqWOQName   = "envoy.formatter.req_without_query"
	celFormatter = "envoy.formatter.cel"
)

// EnvoyConfig is what the dev proxy takes from an Envoy bootstrap: the first
// listener, its HTTP connection manager, the Wasm filter in it, the route's
// cluster, the clusters' addresses and the JSON access log.
type EnvoyConfig struct {
	// Listen is the listener's socket address, "host:port".
	Listen string
	// NodeID is node.id, the filter's xds.node.id property.
	NodeID string
	// Filter is the envoy.filters.http.wasm configuration; nil if the
	// listener has none (the proxy then forwards without a filter).
	Filter *WasmFilter
	// RouteCluster is the cluster of the route matching every path (the
	// first route of the first virtual host).
	RouteCluster string
	// Clusters maps each STATIC or STRICT_DNS cluster's name to the
	// "host:port" of its first endpoint.
	Clusters map[string]string
	// ClusterTLS holds, for each cluster with an envoy.transport_sockets.tls
	// transport socket, its UpstreamTlsContext; its connections are TLS.
	ClusterTLS map[string]*UpstreamTLS
	// AccessLog is the first file or stdout access log with a json_format;
	// nil if there is none.
	AccessLog *AccessLogConfig
	// UseRemoteAddress and PreserveRequestID are the HCM's
	// use_remote_address and preserve_external_request_id; GenerateRequestID
	// is generate_request_id (default true).
	UseRemoteAddress, PreserveRequestID, GenerateRequestID bool
	// XffNumTrustedHops and SkipXffAppend are the HCM's xff_num_trusted_hops
	// and skip_xff_append: with UseRemoteAddress they decide the trusted
	// client address (source.address) and what is appended to
	// x-forwarded-for (see trustedClient).
	XffNumTrustedHops uint32
	SkipXffAppend     bool
	// Admin is admin.address's socket address, host:port ("" without an admin
	// block): where Envoy serves its admin interface, and the dev proxy
	// AdminHandler's endpoints.
	Admin string
	// Honoured and Ignored list, as field paths, what of the file the dev
	// proxy applies and what it leaves out.
	Honoured, Ignored []string
}

// WasmFilter is the PluginConfig of an envoy.filters.http.wasm filter
// (api/envoy/extensions/wasm/v3/wasm.proto).
type WasmFilter struct {
	// Name, RootID and VMID are name, root_id and vm_config.vm_id.
	Name, RootID, VMID string
	// WasmFile is vm_config.code.local.filename.
	WasmFile string
	// PluginConfig is configuration: a StringValue's or BytesValue's raw
	// bytes, a Struct as JSON (as Envoy hands it to proxy_on_configure).
	PluginConfig []byte
	// VMConfig is vm_config.configuration, encoded the same way.
	VMConfig []byte
	// Env is vm_config.environment_variables.key_values.
	Env map[string]string
	// HostEnvKeys is vm_config.environment_variables.host_env_keys: variables
	// copied into the VM from the proxy's own environment, where set.
	HostEnvKeys []string
	// FailOpen is failure_policy FAIL_OPEN (or the deprecated fail_open):
	// a failed VM is bypassed instead of answering 503.
	FailOpen bool
}

// AccessLogConfig is a file (or stdout) access logger with a JSON format.
type AccessLogConfig struct {
	// Path is the file's path ("/dev/stdout" for the stdout logger).
	Path string
	// JSONFormat is log_format.json_format (or the deprecated json_format),
	// rendered with typed values.
	JSONFormat *structpb.Struct
	// Formatters names the formatter extensions declared with it
	// (envoy.formatter.req_without_query, envoy.formatter.cel).
	Formatters []string
}

// ErrEnvoyConfig is matched (errors.Is) by every error of LoadEnvoyConfig
// and ParseEnvoyConfig about the file's content.
var ErrEnvoyConfig = errors.New("devproxy: envoy config")

// ParseBootstrap decodes an Envoy bootstrap in YAML or JSON as Envoy does:
// into envoy.config.bootstrap.v3.Bootstrap, rejecting unknown fields and
// unresolvable typed configs, then runs the API's validation rules
// (protoc-gen-validate, ValidateAll).
func ParseBootstrap(doc []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: YAML: %v", ErrEnvoyConfig, err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrEnvoyConfig, err)
	}
	if err := validateDeep(b, "bootstrap"); err != nil {
		return nil, fmt.Errorf("%w: validation: %v", ErrEnvoyConfig, err)
	}
	return b, nil
}

// validateDeep runs m's ValidateAll and that of every message inside it,
// including those packed in Any fields (typed_config), which the generated
// validation does not open.
func validateDeep(m proto.Message, path string) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		return validateDeep(inner, path+"("+a.GetTypeUrl()+")")
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = validateDeep(l.Get(i).Message().Interface(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = validateDeep(mv.Message().Interface(), p+"["+k.String()+"]")
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = validateDeep(v.Message().Interface(), p)
		}
		return err == nil
	})
	return err
}

// LoadEnvoyConfig reads and parses the bootstrap at path; see
// ParseEnvoyConfig.
func LoadEnvoyConfig(path string) (*EnvoyConfig, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("devproxy: %w", err)
	}
	c, err := ParseEnvoyConfig(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseEnvoyConfig parses a bootstrap (ParseBootstrap) and extracts what
// the dev proxy uses. It needs one listener with an HTTP connection
// manager whose first virtual host's first route goes to a cluster.
func ParseEnvoyConfig(doc []byte) (*EnvoyConfig, error) {
	b, err := ParseBootstrap(doc)
	if err != nil {
		return nil, err
	}
	c := &EnvoyConfig{Clusters: map[string]string{}, ClusterTLS: map[string]*UpstreamTLS{}, GenerateRequestID: true}
	sr := b.GetStaticResources()
	ignoreRest(&c.Ignored, "", b, "static_resources", "node", "admin")
	if sa := b.GetAdmin().GetAddress().GetSocketAddress(); sa != nil {
		c.Admin = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
		c.Honoured = append(c.Honoured, "admin.address "+c.Admin+" (/ready, /stats, /stats/prometheus)")
		ignoreRest(&c.Ignored, "admin.", b.GetAdmin(), "address")
	}
	c.NodeID = b.GetNode().GetId()
	if c.NodeID != "" {
		c.Honoured = append(c.Honoured, "node.id "+strconv.Quote(c.NodeID)+" (property xds.node.id)")
	}
	if b.GetNode() != nil {
		ignoreRest(&c.Ignored, "node.", b.GetNode(), "id")
	}
	ignoreRest(&c.Ignored, "static_resources.", sr, "listeners", "clusters")
	for _, cl := range sr.GetClusters() {
		if err := c.cluster(cl); err != nil {
			return nil, err
		}
	}
	ls := sr.GetListeners()
	if len(ls) == 0 {
		return nil, fmt.Errorf("%w: no listener in static_resources", ErrEnvoyConfig)
	}
	for _, l := range ls[1:] {
		c.Ignored = append(c.Ignored, "listener "+l.GetName()+" (only the first listener is served)")
	}
	if err := c.listener(ls[0]); err != nil {
		return nil, err
	}
	if _, ok := c.Clusters[c.RouteCluster]; !ok {
		return nil, fmt.Errorf("%w: the route's cluster %q is not a STATIC or STRICT_DNS cluster with an endpoint", ErrEnvoyConfig, c.RouteCluster)
	}
	return c, nil
}

func (c *EnvoyConfig) cluster(cl *clusterv3.Cluster) error {
	p := "cluster " + cl.GetName()
	switch cl.GetType() {
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
	default:
		c.Ignored = append(c.Ignored, p+" (type "+cl.GetType().String()+")")
		return nil
	}
	eps := cl.GetLoadAssignment().GetEndpoints()
	if len(eps) == 0 || len(eps[0].GetLbEndpoints()) == 0 {
		return fmt.Errorf("%w: %s: no endpoint", ErrEnvoyConfig, p)
	}
	sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if sa == nil {
		return fmt.Errorf("%w: %s: the first endpoint has no socket_address", ErrEnvoyConfig, p)
	}
	c.Clusters[cl.GetName()] = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	if err := c.upstreamTLS(cl); err != nil {
		return err
	}
	proto := "plain HTTP/1.1"
	if c.ClusterTLS[cl.GetName()] != nil {
		proto = "HTTP/1.1 over TLS (transport_socket " + tlsSocketName + ")"
	}
	c.Honoured = append(c.Honoured, p+": first endpoint "+c.Clusters[cl.GetName()]+" ("+proto+")")
	ignoreRest(&c.Ignored, p+".", cl, "name", "type", "load_assignment", "transport_socket")
	return nil
}

func (c *EnvoyConfig) listener(l *listenerv3.Listener) error {
	p := "listener " + l.GetName()
	sa := l.GetAddress().GetSocketAddress()
	if sa == nil {
		return fmt.Errorf("%w: %s: no socket_address", ErrEnvoyConfig, p)
	}
	c.Listen = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	c.Honoured = append(c.Honoured, p+": address "+c.Listen)
	ignoreRest(&c.Ignored, p+".", l, "name", "address", "filter_chains")
	var hcm *hcmv3.HttpConnectionManager
	for i, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetName() != hcmName || hcm != nil {
				c.Ignored = append(c.Ignored, fmt.Sprintf("%s: filter_chains[%d] network filter %s", p, i, f.GetName()))
				continue
			}
			m := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrEnvoyConfig, hcmName, err)
			}
			hcm = m
		}
	}
	if hcm == nil {
		return fmt.Errorf("%w: %s: no %s", ErrEnvoyConfig, p, hcmName)
	}
	return c.hcm(hcm)
}

func (c *EnvoyConfig) hcm(h *hcmv3.HttpConnectionManager) error {
	p := "http_connection_manager"
	c.UseRemoteAddress = h.GetUseRemoteAddress().GetValue()
	c.PreserveRequestID = h.GetPreserveExternalRequestId()
	if g := h.GetGenerateRequestId(); g != nil {
		c.GenerateRequestID = g.GetValue()
	}
	c.XffNumTrustedHops = h.GetXffNumTrustedHops()
	c.SkipXffAppend = h.GetSkipXffAppend()
	if len(h.GetOriginalIpDetectionExtensions()) > 0 {
		// The client address would differ from Envoy's: refuse rather
		// than key clients on the wrong address.
		return fmt.Errorf("%w: %s: original_ip_detection_extensions are not supported by the dev proxy (use use_remote_address and xff_num_trusted_hops)", ErrEnvoyConfig, p)
	}
	c.Honoured = append(c.Honoured, fmt.Sprintf("%s: use_remote_address %t, xff_num_trusted_hops %d, skip_xff_append %t (client address, x-forwarded-for), x-request-id (generate %t, preserve external %t)",
		p, c.UseRemoteAddress, c.XffNumTrustedHops, c.SkipXffAppend, c.GenerateRequestID, c.PreserveRequestID))
	ignoreRest(&c.Ignored, p+".", h, "route_config", "http_filters", "access_log",
		"use_remote_address", "xff_num_trusted_hops", "skip_xff_append", "preserve_external_request_id", "generate_request_id")
	vhs := h.GetRouteConfig().GetVirtualHosts()
	if len(vhs) == 0 || len(vhs[0].GetRoutes()) == 0 || vhs[0].GetRoutes()[0].GetRoute().GetCluster() == "" {
		return fmt.Errorf("%w: %s: route_config needs a virtual host whose first route has route.cluster", ErrEnvoyConfig, p)
	}
	r := vhs[0].GetRoutes()[0]
	c.RouteCluster = r.GetRoute().GetCluster()
	c.Honoured = append(c.Honoured, "route: every request to cluster "+c.RouteCluster)
	if m := r.GetMatch(); m.GetPrefix() != "/" {
		c.Ignored = append(c.Ignored, "route match "+protojson.Format(m)+" (the dev proxy routes every path)")
	}
	if len(vhs) > 1 || len(vhs[0].GetRoutes()) > 1 {
		c.Ignored = append(c.Ignored, "virtual hosts and routes after the first")
	}
	for _, f := range h.GetHttpFilters() {
		switch {
		case f.GetName() == wasmName && c.Filter == nil:
			m := &wasmfilterv3.Wasm{}
			if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrEnvoyConfig, wasmName, err)
			}
			if err := c.wasm(m.GetConfig()); err != nil {
				return err
			}
		case f.GetName() == routerName:
			c.Honoured = append(c.Honoured, "http filter "+routerName)
		default:
			c.Ignored = append(c.Ignored, "http filter "+f.GetName())
		}
	}
	for _, al := range h.GetAccessLog() {
		if c.AccessLog != nil {
			c.Ignored = append(c.Ignored, "access log "+al.GetName()+" (only the first is written)")
			continue
		}
		if err := c.accessLog(al.GetName(), al.GetTypedConfig()); err != nil {
			return err
		}
	}
	return nil
}

func (c *EnvoyConfig) wasm(pc *wasmv3.PluginConfig) error {
	p := wasmName
	vm := pc.GetVmConfig()
	//lint:ignore SA1019 Envoy still honours the deprecated fail_open when failure_policy is unset, so the dev proxy does too.
	failOpen := pc.GetFailurePolicy() == wasmv3.FailurePolicy_FAIL_OPEN || pc.GetFailOpen()
	f := &WasmFilter{Name: pc.GetName(), RootID: pc.GetRootId(), VMID: vm.GetVmId(),
		WasmFile:    vm.GetCode().GetLocal().GetFilename(),
		Env:         vm.GetEnvironmentVariables().GetKeyValues(),
		HostEnvKeys: vm.GetEnvironmentVariables().GetHostEnvKeys(),
		FailOpen:    failOpen}
	var err error
	if f.PluginConfig, err = anyBytes(pc.GetConfiguration()); err != nil {
		return fmt.Errorf("%w: %s configuration: %v", ErrEnvoyConfig, p, err)
	}
	if f.VMConfig, err = anyBytes(vm.GetConfiguration()); err != nil {
		return fmt.Errorf("%w: %s vm_config.configuration: %v", ErrEnvoyConfig, p, err)
	}
	c.Filter = f
	c.Honoured = append(c.Honoured, fmt.Sprintf("http filter %s: name %q, root_id %q, vm_id %q, configuration (%d bytes), vm_config.configuration, environment_variables (host_env_keys, key_values), code.local.filename %q, failure_policy (fail open: %t)",
		p, f.Name, f.RootID, f.VMID, len(f.PluginConfig), f.WasmFile, f.FailOpen))
	ignoreRest(&c.Ignored, p+".", pc, "name", "root_id", "vm_config", "configuration", "failure_policy", "fail_open")
	ignoreRest(&c.Ignored, p+".vm_config.", vm, "vm_id", "code", "configuration", "environment_variables")
	return nil
}

// anyBytes encodes a plugin or VM configuration as Envoy hands it to the
// guest: StringValue and BytesValue raw, anything else (Struct) as JSON
// (wasm.proto, PluginConfig.configuration).
func anyBytes(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return []byte(v.GetValue()), nil
	case *wrapperspb.BytesValue:
		return v.GetValue(), nil
	default:
		return protojson.Marshal(m)
	}
}

func (c *EnvoyConfig) accessLog(name string, tc *anypb.Any) error {
	p := "access log " + name
	var path string
	var format *corev3.SubstitutionFormatString
	var legacy *structpb.Struct
	m, err := tc.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrEnvoyConfig, p, err)
	}
	switch v := m.(type) {
	case *filev3.FileAccessLog:
		//lint:ignore SA1019 Envoy still reads the deprecated json_format of file access logs, so the dev proxy does too.
		path, format, legacy = v.GetPath(), v.GetLogFormat(), v.GetJsonFormat()
		ignoreRest(&c.Ignored, p+".", v, "path", "log_format", "json_format")
	case *streamv3.StdoutAccessLog:
		path, format = "/dev/stdout", v.GetLogFormat()
	default:
		c.Ignored = append(c.Ignored, p+" ("+string(m.ProtoReflect().Descriptor().FullName())+")")
		return nil
	}
	js := legacy
	if format != nil {
		js = format.GetJsonFormat()
		ignoreRest(&c.Ignored, p+".log_format.", format, "json_format", "formatters")
	}
	if js == nil {
		c.Ignored = append(c.Ignored, p+" (not a json_format)")
		return nil
	}
	al := &AccessLogConfig{Path: path, JSONFormat: js}
	for _, f := range format.GetFormatters() {
		al.Formatters = append(al.Formatters, f.GetName())
	}
	if _, err := CompileFormat(js, al.Formatters); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrEnvoyConfig, p, err)
	}
	c.AccessLog = al
	c.Honoured = append(c.Honoured, fmt.Sprintf("%s: path %s, json_format (%d fields), formatters %s", p, path, len(js.GetFields()), strings.Join(al.Formatters, ", ")))
	return nil
}

// ignoreRest appends to out every populated field of m not named in
// handled, as prefix+name.
func ignoreRest(out *[]string, prefix string, m proto.Message, handled ...string) {
	if m == nil {
		return
	}
	var names []string
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		n := string(fd.Name())
		for _, h := range handled {
			if h == n {
				return true
			}
		}
		names = append(names, prefix+n)
		return true
	})
	sort.Strings(names)
	*out = append(*out, names...)
}
