package rlqsfleet

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"

	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqsclient"
	"github.com/sluice-proxy/sluice/testenv/testkit/rlqstest"
)

var (
	binDir  string
	wasmBin []byte
)

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/sluicectl"},
		func(dir, _ string) (err error) {
			binDir = dir
			wasmBin, err = os.ReadFile(filepath.Join(dir, "sluice.wasm"))
			return err
		})
}

const (
	adminToken = "rlqs-admin"
	readToken  = "rlqs-read"
	quotaToken = "rlqs-quota"
	policyName = "default"
)

// controlPlane is a sluice-controlplane process serving HTTP and gRPC.
type controlPlane struct {
	addr, grpcAddr string
	p              *proctest.Proc
}

func startControlPlane(t *testing.T, redisURL string) *controlPlane {
	t.Helper()
	c := &controlPlane{addr: proctest.FreeAddr(t), grpcAddr: proctest.FreeAddr(t)}
	c.p = proctest.Start(t, proctest.Spec{Name: "control plane " + c.addr, Bin: filepath.Join(binDir, "sluice-controlplane"),
		Args: []string{"--listen", c.addr, "--grpc-listen", c.grpcAddr, "--redis-url", redisURL, "--log-level", "warn", "--resync-interval", "200ms"},
		Env:  []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}})
	c.await(t)
	return c
}

func (c *controlPlane) await(t *testing.T) {
	t.Helper()
	proctest.AwaitHTTP(t, "http://"+c.addr+"/readyz", 15*time.Second, c.p)
	proctest.AwaitListening(t, c.grpcAddr, 15*time.Second, c.p)
}

// bucketSettings is rlqstest's, for cp.
func bucketSettings(t *testing.T, cp *controlPlane, rule string, iv time.Duration) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	t.Helper()
	g := rlqstest.Generator{Sluicectl: filepath.Join(binDir, "sluicectl"), Server: cp.addr, GRPC: cp.grpcAddr, Policy: policyName,
		ReadToken: readToken, QuotaToken: quotaToken}
	return g.BucketSettings(t, rule, iv)
}

// rlqsEnvoy returns an Envoy running the rate_limit_quota filter against addr.
func rlqsEnvoy(t *testing.T, addr string, s *rlqsfilterv3.RateLimitQuotaBucketSettings) *rlqsclient.Client {
	t.Helper()
	return rlqstest.Envoy(t, addr, policyName, quotaToken, s)
}

// wasmEnvoy is an Envoy running the sluice Wasm filter, one worker, whose
// control_plane cluster is cpAddr, enforcing policy version v.
func wasmEnvoy(t *testing.T, cpAddr string, v uint64) *host.Host {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{
		Wasm: wasmBin, VMID: "sluice", PluginName: "sluice",
		PluginConfig: []byte(`{"control_plane":{"cluster":"control_plane","authority":"cp.test","policy":"` + policyName +
			`","token":"` + readToken + `","quota_token":"` + quotaToken + `","wait":"2s","timeout":"7s"},"tick":"50ms"}`),
		Workers: 1, Clock: host.SystemClock,
		Clusters: map[string]string{"control_plane": cpAddr},
		LogLevel: host.LogInfo,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if !proctest.WaitFor(20*time.Second, func() bool {
		_, err := h.Worker(0).Do(context.Background(), host.Request{Path: "/probe"})
		return err == nil && proctest.WorkerVersions(h.Logs(), policyName)[0] == v
	}) {
		t.Fatalf("the Wasm Envoy never enforced version %d", v)
	}
	return h
}
