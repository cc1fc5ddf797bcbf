// Package rlqsfleet tests, end to end, Envoys of both kinds on one fleet key: Envoys
// running the sluice Wasm filter (the real module in the testenv host, leasing from
// POST /v1/quota) and Envoys running Envoy's own rate_limit_quota filter (package
// rlqsclient, streaming to the control plane's Rate Limit Quota Service over gRPC,
// configured with the bucket settings `sluicectl envoy-config rlqs` generates), on two
// control-plane processes sharing a real redis-server. It judges by counting: the
// requests admitted in each window against the limit, through a client's
// disconnection, a control plane killed and restarted, and the other replica
// serving throughout. Traffic is loopback only and bounded in time.
package rlqsfleet
