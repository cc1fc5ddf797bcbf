// Package envoy holds sluice's ready-to-use proxy configuration, and tests
// that keep it loadable:
//
//   - envoy.yaml: an Envoy bootstrap with the sluice Wasm filter, the
//     control-plane and upstream clusters, and the JSON access log; the
//     dev proxy (testenv/devproxy) follows the same file;
//   - envoy-mtls.yaml: the same with mTLS to the control plane (the
//     control_plane cluster's UpstreamTlsContext presents the Envoy's
//     certificate, which identifies it to the quota service);
//   - istio/wasmplugin.yaml: the filter as an Istio WasmPlugin;
//   - istio/controlplane.yaml: the ServiceEntry, DestinationRule
//     (ISTIO_MUTUAL) and PeerAuthentication (STRICT) that let the filter
//     reach the control plane from the mesh over mTLS only;
//   - kubernetes/controlplane.yaml: the control plane's Deployment,
//     Service, PodDisruptionBudget and ConfigMap (deploy_test.go decodes
//     them with k8s.io/api); kubernetes/controlplane-mtls.yaml patches the
//     Deployment to serve mTLS outside a mesh;
//   - gateway/sluice.yaml: the filter on Envoy Gateway, an
//     EnvoyExtensionPolicy with a Wasm image source, the EnvoyPatchPolicy
//     adding the control plane's mTLS cluster and the EnvoyProxy mounting
//     the proxy's certificate (decoded with Envoy Gateway's api/v1alpha1);
//   - monitoring/grafana-dashboard.json and monitoring/prometheus-rules.yaml:
//     a Grafana dashboard and Prometheus alert rules for the filter's and the
//     control plane's metrics (monitoring_test.go checks every filter metric
//     they name against what the real filter defines; the control plane's
//     tests check theirs against its /metrics; testenv/suites/e2e checks every series
//     is served after a demo); monitoring/prometheus-operator.yaml scrapes
//     them (a ServiceMonitor and PodMonitors), and package
//     envoy/monitoring reads their PromQL for those tests;
//   - kubernetes/redis.yaml: a Redis as an SRE would run it, and the
//     NetworkPolicies; istio/tokens.yaml and istio/gateway-env.patch.yaml:
//     the proxies' tokens from a Secret.
//
// config_test.go parses every file with Envoy's and Istio's own API
// definitions (go-control-plane and istio.io/api generated types, unknown
// fields rejected, Envoy's validation rules run) and starts the real
// sluice.wasm with each embedded plugin configuration, so a misspelt
// field or a configuration the filter refuses fails CI. The package has no
// other code.
package envoy
