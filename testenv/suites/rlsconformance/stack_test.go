package rlsconformance

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// service is one RateLimitService under test.
type service struct {
	name   string
	client rlsv3.RateLimitServiceClient
	md     metadata.MD // sent with every call
	proc   *proctest.Proc
}

func (s *service) call(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.md != nil {
		ctx = metadata.NewOutgoingContext(ctx, s.md)
	}
	resp, err := s.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("%s: ShouldRateLimit: %v", s.name, err)
	}
	return resp
}

func dial(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// configFile is one of the peer's configuration files: its name and where it
// is in the module.
type configFile struct{ name, path string }

// startPeer runs envoyproxy/ratelimit on a fresh Redis with files as its
// configuration (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, as its README
// says), merging domains when merge, extra in its environment, and waits
// until it serves.
func startPeer(t *testing.T, files []configFile, merge bool, extra ...string) *service {
	t.Helper()
	bin, _ := peer(t)
	return startAsRatelimit(t, "envoyproxy/ratelimit", bin, nil, files, merge, extra)
}

// startSluiceAsRatelimit runs sluice's image command, sluice-controlplane
// ratelimit, configured exactly as startPeer configures envoyproxy/ratelimit.
func startSluiceAsRatelimit(t *testing.T, files []configFile, merge bool, extra ...string) *service {
	t.Helper()
	return startAsRatelimit(t, "sluice ratelimit", filepath.Join(binDir, "sluice-controlplane"), []string{"ratelimit"}, files, merge, extra)
}

// startAsRatelimit runs bin with args as envoyproxy/ratelimit's service is
// run: files in RUNTIME_ROOT/ratelimit/config, a fresh Redis, the listeners
// on free loopback ports, extra in the environment.
func startAsRatelimit(t *testing.T, name, bin string, args []string, files []configFile, merge bool, extra []string) *service {
	t.Helper()
	rs := redisproc.Start(t)
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfgDir, f.name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	httpAddr, grpcAddr, debugAddr := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	env := []string{"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rs.Addr(),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"MERGE_DOMAIN_CONFIG=" + strconv.FormatBool(merge)}
	for _, l := range []struct{ host, port, addr string }{{"HOST", "PORT", httpAddr}, {"GRPC_HOST", "GRPC_PORT", grpcAddr},
		{"DEBUG_HOST", "DEBUG_PORT", debugAddr}} {
		h, p, _ := net.SplitHostPort(l.addr)
		env = append(env, l.host+"="+h, l.port+"="+p)
	}
	p := proctest.Start(t, proctest.Spec{Name: name, Bin: bin, Args: args, Env: append(env, extra...), Dir: root})
	proctest.AwaitHTTP(t, "http://"+httpAddr+"/healthcheck", readyTimeout, p)
	return &service{name: name, client: dial(t, grpcAddr), proc: p}
}

// importFiles runs sluicectl import ratelimit on files (with --merge-domains
// when merge) and returns its standard output, standard error and whether it
// succeeded.
func importFiles(t *testing.T, files []configFile, merge bool) (policy, stderr string, ok bool) {
	t.Helper()
	args := []string{"import", "ratelimit", "--policy", "conformance"}
	if merge {
		args = append(args, "--merge-domains")
	}
	for _, f := range files {
		args = append(args, f.path)
	}
	cmd := exec.Command(filepath.Join(binDir, "sluicectl"), args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	return string(out), errb.String(), err == nil
}

// startSluice imports files as docs/rls.md says and runs a control plane on a
// fresh Redis serving the policy over --grpc-listen.
func startSluice(t *testing.T, files []configFile, merge bool) *service {
	t.Helper()
	pol, stderr, ok := importFiles(t, files, merge)
	if !ok {
		t.Fatalf("sluicectl import ratelimit refused what envoyproxy/ratelimit loads:\n%s", stderr)
	}
	polFile := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(polFile, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := redisproc.Start(t)
	addr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := proctest.Start(t, proctest.Spec{Name: "sluice-controlplane", Bin: filepath.Join(binDir, "sluice-controlplane"),
		Args: []string{"--listen", addr, "--grpc-listen", grpcAddr, "--redis-url", rs.URL(), "--log-level", "warn",
			"--bootstrap-policy", polFile},
		Env: []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}, Dir: repo})
	proctest.AwaitHTTP(t, "http://"+addr+"/readyz", readyTimeout, p)
	proctest.AwaitListening(t, grpcAddr, readyTimeout, p)
	return &service{name: "sluice", client: dial(t, grpcAddr), md: metadata.Pairs("authorization", "Bearer "+quotaToken), proc: p}
}
