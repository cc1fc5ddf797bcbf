package rlsdeploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/ratelimitpeer"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// impl is one image the Deployment runs: its command, and how to tell that
// it tried to load a configuration and kept the last good one.
type impl struct {
	name string
	bin  func(t *testing.T) string
	// refusedLoad reports whether d has refused a configuration change.
	refusedLoad func(t *testing.T, d *deployment) bool
}

var impls = []impl{
	{name: "envoyproxy/ratelimit",
		bin: func(t *testing.T) string { b, _ := ratelimitpeer.Build(t, binDir); return b },
		refusedLoad: func(_ *testing.T, d *deployment) bool {
			return strings.Contains(d.proc.Output(), "Error loading new configuration")
		}},
	{name: "sluice /bin/ratelimit",
		bin: func(*testing.T) string { return filepath.Join(binDir, "ratelimit") },
		refusedLoad: func(t *testing.T, d *deployment) bool {
			return metric(t, "http://"+d.debug+"/metrics", `sluice_controlplane_rls_config_loads_total{result="error"}`) >= 1
		}},
}

// deployment is one running service: its listeners, its process and a
// RateLimitService client.
type deployment struct {
	http, grpc, debug string
	proc              *proctest.Proc
	client            rlsv3.RateLimitServiceClient
}

// deploy starts the image of im as envoyproxy/ratelimit's Deployment in
// Istio's and Contour's guides runs it (REDIS_SOCKET_TYPE=tcp, the rules
// under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, USE_STATSD=false), on a
// fresh Redis and loopback listeners, with env added, and waits for
// /healthcheck. With creds the client dials over TLS.
func deploy(t *testing.T, im impl, root string, creds credentials.TransportCredentials, env ...string) *deployment {
	t.Helper()
	rs := redisproc.Start(t)
	d := &deployment{http: proctest.FreeAddr(t), grpc: proctest.FreeAddr(t), debug: proctest.FreeAddr(t)}
	all := []string{"USE_STATSD=false", "LOG_LEVEL=info", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rs.Addr(),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit"}
	for _, l := range []struct{ host, port, addr string }{{"HOST", "PORT", d.http}, {"GRPC_HOST", "GRPC_PORT", d.grpc},
		{"DEBUG_HOST", "DEBUG_PORT", d.debug}} {
		h, p, _ := net.SplitHostPort(l.addr)
		all = append(all, l.host+"="+h, l.port+"="+p)
	}
	d.proc = proctest.Start(t, proctest.Spec{Name: im.name, Bin: im.bin(t), Env: append(all, env...), Dir: root})
	proctest.AwaitHTTP(t, "http://"+d.http+"/healthcheck", readyTimeout, d.proc)
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(d.grpc, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	d.client = rlsv3.NewRateLimitServiceClient(conn)
	return d
}

// call sends one descriptor of domain with hits (the descriptor's
// hits_addend: 0 checks without counting, where the request's 0 means 1).
func (d *deployment) call(domain string, hits uint64, kv ...string) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	desc := &commonrl.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(hits)}
	for i := 0; i+1 < len(kv); i += 2 {
		desc.Entries = append(desc.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*commonrl.RateLimitDescriptor{desc}})
}

// limitOf is the requests_per_unit answered for api's key user=alice, 0 if none.
func (d *deployment) limitOf(t *testing.T) uint32 {
	t.Helper()
	resp, err := d.call("api", 0, "user", "alice")
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// configMap is a directory as the kubelet writes a ConfigMap volume
// (pkg/volume/util/atomic_writer.go): each version of the files in a
// "..<timestamp>" directory, "..data" a symbolic link to the current one,
// swapped by renaming a new link over it, and each file a symbolic link
// through "..data".
type configMap struct {
	dir string
	n   int
}

// put makes files the ConfigMap's content, atomically.
func (c *configMap) put(t *testing.T, files map[string]string) {
	t.Helper()
	c.n++
	ts := fmt.Sprintf("..2026_12_02_00_00_%02d.%d", c.n, c.n)
	if err := os.MkdirAll(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(c.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func apiConfig(limit string) map[string]string {
	return map[string]string{"config.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: " + limit + "\n"}
}

// TestAConfigMapChangeIsServedAndABrokenOneIsNot mounts the rules as Istio's
// global rate limiting sample does (a ConfigMap volume at
// RUNTIME_ROOT/ratelimit/config, RUNTIME_WATCH_ROOT=false,
// RUNTIME_IGNOREDOTFILES=true), then changes the ConfigMap three times: a new
// limit is served within changeTimeout; a file that does not load is refused
// and the last good limit kept; a good file after it is served again.
func TestAConfigMapChangeIsServedAndABrokenOneIsNot(t *testing.T) {
	for _, im := range impls {
		t.Run(strings.ReplaceAll(im.name, "/", "_"), func(t *testing.T) {
			root := t.TempDir()
			cm := &configMap{dir: filepath.Join(root, "ratelimit", "config")}
			cm.put(t, apiConfig("3"))
			d := deploy(t, im, root, nil, "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true")
			if got := d.limitOf(t); got != 3 {
				t.Fatalf("limit %d at start, want 3", got)
			}
			awaitLimit := func(want uint32) {
				t.Helper()
				start := time.Now()
				if !proctest.WaitFor(changeTimeout, func() bool { return d.limitOf(t) == want }) {
					t.Fatalf("limit %d not served within %s of the ConfigMap change (still %d)", want, changeTimeout, d.limitOf(t))
				}
				t.Logf("%s: limit %d served %s after the ConfigMap changed", im.name, want, time.Since(start).Round(time.Millisecond))
			}
			cm.put(t, apiConfig("5"))
			awaitLimit(5)

			cm.put(t, map[string]string{"config.yaml": "domain: api\ndescriptors: [\n"})
			if !proctest.WaitFor(changeTimeout, func() bool { return im.refusedLoad(t, d) }) {
				t.Fatalf("no sign of the broken ConfigMap being read within %s", changeTimeout)
			}
			if got := d.limitOf(t); got != 5 {
				t.Fatalf("limit %d after a broken ConfigMap, want the last good one, 5", got)
			}
			resp, err := d.call("api", 5, "user", "alice")
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("5 hits of 5 after a broken ConfigMap: %v %v", resp, err)
			}
			if resp, err = d.call("api", 1, "user", "alice"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("a 6th hit of 5: %v %v", resp, err)
			}

			cm.put(t, apiConfig("7"))
			awaitLimit(7)
		})
	}
}

// TestTheServiceAnswersItsHTTPAndDebugListenersAsEnvoyproxyRatelimit loads
// envoyproxy/ratelimit's example configuration as its README lays it out
// (RUNTIME_WATCH_ROOT left true: the files under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config) into both, and compares what
// operators and probes read: /healthcheck, /rlconfig (line order aside: it
// is a map's there), /json answers and codes, and the gRPC health service.
func TestTheServiceAnswersItsHTTPAndDebugListenersAsEnvoyproxyRatelimit(t *testing.T) {
	_, mod := ratelimitpeer.Build(t, binDir)
	example, err := os.ReadFile(filepath.Join(mod, "examples", "ratelimit", "config", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	for _, im := range impls {
		root := t.TempDir()
		dir := filepath.Join(root, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "example.yaml"), example, 0o644); err != nil {
			t.Fatal(err)
		}
		d := deploy(t, im, root, nil)
		var got []string
		code, body := get(t, "http://"+d.http+"/healthcheck")
		got = append(got, "healthcheck: "+strconv.Itoa(code)+" "+body)
		_, dump := get(t, "http://"+d.debug+"/rlconfig")
		lines := strings.Split(strings.TrimSpace(dump), "\n")
		slicesSort(lines)
		got = append(got, lines...)
		for i := range 5 { // category: account is 4 a minute
			code, body := postJSON(t, "http://"+d.http+"/json", `{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}`)
			got = append(got, fmt.Sprintf("json call %d: %d %s", i+1, code, overall(body)))
		}
		code, _ = postJSON(t, "http://"+d.http+"/json", `{"domain":`)
		got = append(got, "json unparsable: "+strconv.Itoa(code))
		seen[im.name] = got
	}
	peer, ours := seen[impls[0].name], seen[impls[1].name]
	if strings.Join(peer, "\n") != strings.Join(ours, "\n") {
		t.Errorf("envoyproxy/ratelimit:\n%s\n\nsluice:\n%s", strings.Join(peer, "\n"), strings.Join(ours, "\n"))
	}
	if len(peer) < 15 || !strings.Contains(strings.Join(peer, "\n"), "json call 5: 429 OVER_LIMIT") {
		t.Errorf("the peer's answers are not what the check assumes:\n%s", strings.Join(peer, "\n"))
	}
}

// TestMutualTLSRefusesCallersWithoutTheCAsCertificate serves gRPC over TLS as
// Envoy Gateway sets envoyproxy/ratelimit up (GRPC_SERVER_USE_TLS, a server
// certificate, GRPC_CLIENT_TLS_CACERT requiring client certificates from its
// CA, GRPC_CLIENT_TLS_SAN naming the one SAN accepted): a client with the
// CA's certificate for that SAN is answered; one without a certificate, or
// with one for another name, is refused.
func TestMutualTLSRefusesCallersWithoutTheCAsCertificate(t *testing.T) {
	ca := newCA(t)
	for _, im := range impls {
		t.Run(strings.ReplaceAll(im.name, "/", "_"), func(t *testing.T) {
			root := t.TempDir()
			(&configMap{dir: filepath.Join(root, "ratelimit", "config")}).put(t, apiConfig("3"))
			pki := t.TempDir()
			srvCert, srvKey := ca.Server(t).Write(t, pki, "server")
			caFile := ca.WriteCA(t, pki, "ca")
			good := ca.Issue(t, leaf("envoy.envoy-gateway-system.svc"))
			other := ca.Issue(t, leaf("someone-else.example"))
			withCert := func(c *tls.Certificate) credentials.TransportCredentials {
				cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
				if c != nil {
					cfg.Certificates = []tls.Certificate{*c}
				}
				return credentials.NewTLS(cfg)
			}
			gc := good.TLS(t)
			d := deploy(t, im, root, withCert(&gc), "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
				"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+srvCert, "GRPC_SERVER_TLS_KEY="+srvKey,
				"GRPC_CLIENT_TLS_CACERT="+caFile, "GRPC_CLIENT_TLS_SAN=envoy.envoy-gateway-system.svc")
			if got := d.limitOf(t); got != 3 {
				t.Fatalf("over mTLS with the CA's certificate: limit %d, want 3", got)
			}
			oc := other.TLS(t)
			for name, creds := range map[string]credentials.TransportCredentials{"no client certificate": withCert(nil),
				"a certificate for another SAN": withCert(&oc)} {
				conn, err := grpc.NewClient(d.grpc, grpc.WithTransportCredentials(creds))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}})
				cancel()
				conn.Close()
				if err == nil {
					t.Errorf("a caller with %s was answered", name)
				}
			}
		})
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// overall is the overallCode of a /json answer.
func overall(body string) string {
	_, rest, ok := strings.Cut(body, `"overallCode":`)
	if !ok {
		return "(none)"
	}
	v, _, _ := strings.Cut(strings.TrimSpace(rest), ",")
	return strings.Trim(v, `" }`)
}

// metric is the value of the series named exactly series at url, -1 if absent.
func metric(t *testing.T, url, series string) float64 {
	t.Helper()
	_, body := get(t, url)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
