module github.com/sluice-proxy/sluice

go 1.24.0

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/getkin/kin-openapi v0.135.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/redis/go-redis/v9 v9.20.1 // indirect
	github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0 // indirect
	github.com/tetratelabs/wazero v1.11.0 // indirect
	go.etcd.io/bbolt v1.4.3 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
)
