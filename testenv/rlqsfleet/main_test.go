package rlqsfleet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-proxy/sluice/testenv/devproxy"
	"github.com/sluice-proxy/sluice/testenv/host"
	"github.com/sluice-proxy/sluice/testenv/internal/proctest"
	"github.com/sluice-proxy/sluice/testenv/rlqsclient"
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

// bucketSettings runs `sluicectl envoy-config rlqs` on the stored policy, with
// reporting interval iv, and returns the settings of rule's bucket matcher: what
// an Envoy configured with its output would use.
func bucketSettings(t *testing.T, cp *controlPlane, rule string, iv time.Duration) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), "--server", "http://"+cp.addr, "envoy-config", "rlqs", "--policy", policyName,
		"--grpc", cp.grpcAddr, "--reporting-interval", iv.String())
	cmd.Env = append(os.Environ(), "SLUICE_READ_TOKEN="+readToken, "SLUICE_QUOTA_TOKEN="+quotaToken)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl envoy-config rlqs: %v", err)
	}
	b, err := devproxy.ParseBootstrap(out)
	if err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var f rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&f); err != nil {
		t.Fatal(err)
	}
	if md := f.GetRlqsServer().GetInitialMetadata(); len(md) != 1 || md[0].GetValue() != "Bearer "+quotaToken {
		t.Fatalf("the generated filter sends metadata %v, want the quota token", md)
	}
	for _, m := range f.GetBucketMatchers().GetMatcherList().GetMatchers() {
		a := m.GetOnMatch().GetAction()
		if a.GetName() != "sluice."+rule {
			continue
		}
		var s rlqsfilterv3.RateLimitQuotaBucketSettings
		if err := a.GetTypedConfig().UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	t.Fatalf("no bucket matcher for rule %s", rule)
	return nil
}

// rlqsEnvoy returns an Envoy running the rate_limit_quota filter against addr,
// with the quota token as the generated configuration sends it.
func rlqsEnvoy(t *testing.T, addr string, s *rlqsfilterv3.RateLimitQuotaBucketSettings) *rlqsclient.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	c := rlqsclient.New(conn, rlqsclient.NewRealClock(time.Hour), rlqsclient.Config{Domain: "default", Settings: s,
		Metadata: map[string]string{"authorization": "Bearer " + quotaToken}, StartTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { c.Close(); conn.Close() })
	return c
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
