package rlssource

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlsimport"
)

// XDSOptions configure NewXDS.
type XDSOptions struct {
	// Server is the management server, a gRPC target such as host:port
	// (CONFIG_GRPC_XDS_SERVER_URL). Required.
	Server string
	// NodeID and NodeMetadata make the node sent with every request
	// (CONFIG_GRPC_XDS_NODE_ID; CONFIG_GRPC_XDS_NODE_METADATA,
	// "key=value,key=value", each value a string).
	NodeID, NodeMetadata string
	// Headers are sent as gRPC metadata on the stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// TLS, when not nil, dials the server over TLS with it
	// (CONFIG_GRPC_XDS_SERVER_USE_TLS and its certificate variables).
	TLS *tls.Config
	// BackoffMin and BackoffMax bound the wait before reconnecting after the
	// stream breaks: it doubles from BackoffMin, jittered by half, up to
	// BackoffMax, and starts again at BackoffMin once a response arrives
	// (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, XDS_CLIENT_BACKOFF_MAX_INTERVAL;
	// defaults 1s and 60s).
	BackoffMin, BackoffMax time.Duration
	// MaxRecvBytes bounds a response (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0
	// is gRPC's default, 4 MiB.
	MaxRecvBytes int
	// MergeDomains lets several resources name one domain (MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// Policy names the policy served (default "ratelimit").
	Policy string
	// Registry receives the metrics; nil registers none.
	Registry prometheus.Registerer
	// Logger receives connections, loads and failures; nil means slog.Default().
	Logger *slog.Logger
}

// XDS serves RateLimitConfig resources
// (ratelimit.config.ratelimit.v3.RateLimitConfig, go-control-plane's
// ratelimit/config/ratelimit/v3) received over an aggregated discovery
// stream in state-of-the-world mode, as envoyproxy/ratelimit's
// GRPC_XDS_SOTW config type does (src/provider/xds_grpc_sotw_provider.go):
// every response is the whole set; one that imports is served at once and
// ACKed, one that does not is NACKed with the reason and the last good set
// kept. Each resource is read as the configuration file it stands for
// (src/config/config_xds.go, ConfigXdsProtoToYaml), named by its name.
type XDS struct {
	*Served
	o XDSOptions

	firstOnce sync.Once
	first     chan struct{}
}

// NewXDS returns an XDS that has received nothing yet; call Run.
func NewXDS(o XDSOptions) *XDS {
	if o.BackoffMin <= 0 {
		o.BackoffMin = time.Second
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(o.BackoffMin, time.Minute)
	}
	return &XDS{Served: newServed(o.Policy, o.MergeDomains, "xds://"+o.Server, o.Registry, o.Logger), o: o,
		first: make(chan struct{})}
}

// Received is closed once a first response has been handled, served or refused.
func (x *XDS) Received() <-chan struct{} { return x.first }

// Run keeps a stream to the management server until ctx ends, connecting
// again after a break with the backoff of XDSOptions.
func (x *XDS) Run(ctx context.Context) {
	wait := x.o.BackoffMin
	for ctx.Err() == nil {
		got, err := x.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			wait = x.o.BackoffMin
		}
		d := wait/2 + rand.N(wait/2+1)
		x.log.Warn("rate limit configuration: xDS stream ended; connecting again", "server", x.o.Server, "err", err, "in", d.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		wait = min(2*wait, x.o.BackoffMax)
	}
}

// stream runs one ADS stream until it breaks; got reports whether a
// response arrived on it.
func (x *XDS) stream(ctx context.Context) (got bool, err error) {
	creds := insecure.NewCredentials()
	if x.o.TLS != nil {
		creds = credentials.NewTLS(x.o.TLS)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if x.o.MaxRecvBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.o.MaxRecvBytes)))
	}
	conn, err := grpc.NewClient(x.o.Server, opts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, metadata.New(x.o.Headers)))
	defer cancel()
	c := sotw.NewADSClient(sctx, x.node(), resource.RateLimitConfigType)
	// Wait for the server as envoyproxy/ratelimit's blocking dial does,
	// with gRPC's own connection backoff, rather than fail at once.
	if err := c.InitConnect(conn, grpc.WaitForReady(true)); err != nil {
		return false, err
	}
	x.log.Info("rate limit configuration: xDS stream open", "server", x.o.Server, "node", x.o.NodeID)
	for {
		resp, err := c.Fetch()
		if err != nil {
			return got, err
		}
		got = true
		if aerr := x.apply(resp.Resources); aerr != nil {
			err = c.Nack(aerr.Error())
		} else {
			err = c.Ack()
		}
		x.firstOnce.Do(func() { close(x.first) })
		if err != nil {
			return got, err
		}
	}
}

// node is the Node of the discovery requests.
func (x *XDS) node() *corev3.Node {
	md := map[string]*structpb.Value{}
	for _, kv := range strings.Split(x.o.NodeMetadata, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			md[k] = structpb.NewStringValue(v)
		}
	}
	return &corev3.Node{Id: x.o.NodeID, Metadata: &structpb.Struct{Fields: md}}
}

// apply serves the resources of one response, or returns why not.
func (x *XDS) apply(res []*anypb.Any) error {
	files := make([]rlsimport.File, 0, len(res))
	for _, a := range res {
		var c rlsconfv3.RateLimitConfig
		if err := a.UnmarshalTo(&c); err != nil {
			return x.failed(errors.New("a resource is not a RateLimitConfig: " + err.Error()))
		}
		b, err := yaml.Marshal(configYAML(&c))
		if err != nil {
			return x.failed(err)
		}
		files = append(files, rlsimport.File{Name: c.Name, Data: b})
	}
	return x.set(files)
}

// The YAML form of a RateLimitConfig, as ConfigXdsProtoToYaml maps it.
type (
	yamlRoot struct {
		Domain      string     `yaml:"domain"`
		Descriptors []yamlDesc `yaml:"descriptors,omitempty"`
	}
	yamlDesc struct {
		Key            string     `yaml:"key"`
		Value          string     `yaml:"value,omitempty"`
		RateLimit      *yamlLimit `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDesc `yaml:"descriptors,omitempty"`
		ShadowMode     bool       `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool       `yaml:"detailed_metric,omitempty"`
	}
	yamlLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit uint32        `yaml:"requests_per_unit"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

func configYAML(c *rlsconfv3.RateLimitConfig) yamlRoot {
	return yamlRoot{Domain: c.Domain, Descriptors: descsYAML(c.Descriptors)}
}

func descsYAML(ds []*rlsconfv3.RateLimitDescriptor) []yamlDesc {
	out := make([]yamlDesc, len(ds))
	for i, d := range ds {
		out[i] = yamlDesc{Key: d.Key, Value: d.Value, Descriptors: descsYAML(d.Descriptors), ShadowMode: d.ShadowMode,
			DetailedMetric: d.DetailedMetric}
		if p := d.RateLimit; p != nil {
			l := &yamlLimit{RequestsPerUnit: p.RequestsPerUnit, Unlimited: p.Unlimited, Name: p.Name}
			// An unset unit is UNKNOWN there: refused unless the limit is
			// unlimited, where no unit is right.
			if p.Unit != rlsconfv3.RateLimitUnit_UNKNOWN || !p.Unlimited {
				l.Unit = p.Unit.String()
			}
			for _, r := range p.Replaces {
				l.Replaces = append(l.Replaces, yamlReplace{Name: r.Name})
			}
			out[i].RateLimit = l
		}
	}
	return out
}
