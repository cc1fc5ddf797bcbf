package api_test

import (
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/api"
	"github.com/sluice-proxy/sluice/controlplane/internal/cli"
	"github.com/sluice-proxy/sluice/controlplane/internal/registry"
)

// BenchmarkStatus1000 registers 1,000 Envoys through real long polls (each
// names its node and runs the current version), then measures the status of
// the policy on loopback, one request at a time: "api" is GET
// /v1/policies/{p}/status, "sluicectl" the whole `sluicectl status p`
// (request, decoding, table). Reports p50/p99/max in milliseconds.
func BenchmarkStatus1000(b *testing.B) {
	reg := registry.New(registry.Options{})
	r := startReplica(b, boltBackend(b), func(o *api.Options) { o.Envoys = reg })
	c := rawClient(64)
	if put(b, c, r.ts.URL+"/v1/policies/p", policyDoc("p", 1)) != 201 {
		b.Fatal("create failed")
	}
	tag := r.admin.Do("GET", "/v1/policies/p", nil).ETag()
	for i := range 1000 {
		if code, _ := get(b, c, r.ts.URL+"/v1/policies/p?wait=1ms", "X-Sluice-Node", "envoy-"+strconv.Itoa(i),
			"X-Sluice-Version", tag, "X-Sluice-Build", "bench"); code != 200 {
			b.Fatalf("poll %d: %d", i, code)
		}
	}
	if n, _ := reg.Len(); n != 1000 {
		b.Fatalf("%d Envoys registered", n)
	}
	b.Run("api", func(b *testing.B) {
		lat := make([]time.Duration, b.N)
		for i := 0; i < b.N; i++ {
			start := time.Now()
			code, body := get(b, c, r.ts.URL+"/v1/policies/p/status")
			lat[i] = time.Since(start)
			if code != 200 || len(body) < 1000*100 {
				b.Fatalf("status %d, %d bytes", code, len(body))
			}
		}
		report(b, lat)
	})
	b.Run("sluicectl", func(b *testing.B) {
		env := map[string]string{"SLUICE_SERVER": r.ts.URL, "SLUICE_READ_TOKEN": readToken}
		lat := make([]time.Duration, b.N)
		for i := 0; i < b.N; i++ {
			start := time.Now()
			code := cli.Main([]string{"status", "p"}, cli.Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(k string) string { return env[k] }})
			lat[i] = time.Since(start)
			if code != 0 {
				b.Fatalf("sluicectl status: exit %d", code)
			}
		}
		report(b, lat)
	})
}
