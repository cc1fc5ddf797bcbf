package rlsdeploy

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
	"github.com/sluice-proxy/sluice/testenv/testkit/envoyproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// envoyRatelimitBootstrap is an Envoy in front of one upstream whose
// ratelimit filter (envoy.filters.http.ratelimit, domain "api") sends each
// request's x-user header as the descriptor user=<value> to the cluster
// "ratelimit" over mTLS (its client certificate, the service's CA, SNI
// localhost), failing closed, and writes one JSON access-log line per request.
const envoyRatelimitBootstrap = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: ingress
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: /dev/stdout
              log_format:
                json_format: {code: "%RESPONSE_CODE%", flags: "%RESPONSE_FLAGS%", user: "%REQ(X-USER)%"}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-user, descriptor_key: user}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: api
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: ratelimit}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}}]}]
  - name: ratelimit
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          tls_certificates:
          - certificate_chain: {filename: CLIENT_CERT}
            private_key: {filename: CLIENT_KEY}
          validation_context:
            trusted_ca: {filename: SERVICE_CA}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: localhost}
    load_assignment:
      cluster_name: ratelimit
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}}]}]
`

// TestEnvoysRatelimitFilterIsAnsweredOverMutualTLS puts the real Envoy's
// ratelimit filter in front of each service, the service requiring Envoy's
// client certificate (GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN) as Envoy
// Gateway's mTLS between Envoy and the service does, and counts from Envoy's
// access log: of 8 requests of one user at 3 a minute, the first 3 reach the
// upstream and the other 5 are refused 429 by the filter (flag RL); none is
// refused before 3 were admitted and none fails for the service.
func TestEnvoysRatelimitFilterIsAnsweredOverMutualTLS(t *testing.T) {
	envoyproc.Binary(t, repoRoot(t))
	ca := newCA(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(up.Close)
	for _, im := range impls {
		t.Run(strings.ReplaceAll(im.name, "/", "_"), func(t *testing.T) {
			root := t.TempDir()
			(&configMap{dir: filepath.Join(root, "ratelimit", "config")}).put(t, apiConfig("3"))
			pki := t.TempDir()
			srvCert, srvKey := ca.Server(t).Write(t, pki, "server")
			cliCert, cliKey := ca.Issue(t, leaf("envoy.envoy-gateway-system.svc")).Write(t, pki, "envoy")
			caFile := ca.WriteCA(t, pki, "ca")
			d := deploy(t, im, root, nil, "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
				"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+srvCert, "GRPC_SERVER_TLS_KEY="+srvKey,
				"GRPC_CLIENT_TLS_CACERT="+caFile, "GRPC_CLIENT_TLS_SAN=envoy.envoy-gateway-system.svc")
			boot := filepath.Join(t.TempDir(), "envoy.yaml")
			cfg := strings.NewReplacer("CLIENT_CERT", cliCert, "CLIENT_KEY", cliKey, "SERVICE_CA", caFile).Replace(envoyRatelimitBootstrap)
			if err := os.WriteFile(boot, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			logFile := filepath.Join(t.TempDir(), "access.log")
			e := envoyproc.Start(t, envoyproc.Options{Name: "envoy", Root: repoRoot(t), Config: boot,
				Rewrite: bootstrap.Rewrite{Listeners: []string{proctest.FreeAddr(t)}, Admin: proctest.FreeAddr(t), AccessLog: logFile,
					Clusters: map[string]string{"upstream": strings.TrimPrefix(up.URL, "http://"), "ratelimit": d.grpc}}})
			var codes []int
			for range 8 {
				req, _ := http.NewRequest("GET", "http://"+e.Listener+"/", nil)
				req.Header.Set("x-user", "alice")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				codes = append(codes, resp.StatusCode)
			}
			var lines []map[string]any
			if !proctest.WaitFor(changeTimeout, func() bool { lines = envoyproc.ReadJSONLines(t, logFile); return len(lines) >= 8 }) {
				t.Fatalf("%d access-log lines, want 8", len(lines))
			}
			admitted, refused := 0, 0
			for i, l := range lines {
				switch {
				case l["code"] == float64(200):
					admitted++
					if refused > 0 {
						t.Errorf("line %d admitted after a refusal: %v", i, lines)
					}
				case l["code"] == float64(429) && l["flags"] == "RL":
					refused++
					if admitted < 3 {
						t.Errorf("line %d refused with %d of 3 admitted: %v", i, admitted, lines)
					}
				default:
					t.Errorf("line %d: %v (the service failed or was not reached)", i, l)
				}
			}
			if admitted != 3 || refused != 5 {
				t.Errorf("%s: %d admitted, %d refused (clients saw %v), want 3 and 5", im.name, admitted, refused, codes)
			}
		})
	}
}

// repoRoot is the module root (the Envoy binary is its build/envoy).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := proctest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
