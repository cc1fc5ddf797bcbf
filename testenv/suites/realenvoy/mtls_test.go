package realenvoy

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

// TestAFleetRuleHoldsOverMTLSWithoutTokens: envoy/envoy-mtls.yaml as shipped
// (its /etc/sluice/tls/ files rewritten to a test CA's), three proxies each
// presenting a certificate of its own (URI SAN spiffe://sluice.test/ns/e2e/sa/proxy-i)
// to two control planes that verify them and have no read or quota token: the
// policy arrives, the fleet spends one budget, exactly L, and the control plane
// names each Envoy by its SAN.
func TestAFleetRuleHoldsOverMTLSWithoutTokens(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			pki := t.TempDir()
			ca := testpki.NewCA(t, "sluice realenvoy")
			srv := ca.Issue(t, testpki.Leaf{CommonName: "sluice-controlplane", DNS: []string{"sluice-controlplane"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
			certFile, keyFile := srv.Write(t, pki, "server")
			client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "sluice-controlplane"}}}
			f := &fleet{redis: redisproc.Start(t), killed: map[int]bool{}}
			for i := 0; i < 2; i++ {
				addr := proctest.FreeAddr(t)
				p := startProc(t, "control plane "+strconv.Itoa(i), "sluice-controlplane", []string{"--listen", addr, "--log-level", "warn",
					"--redis-url", f.redis.URL(), "--resync-interval", "200ms",
					"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--client-ca-file", ca.WriteCA(t, pki, "ca")},
					[]string{"SLUICE_ADMIN_TOKEN=" + adminToken})
				if !proctest.WaitFor(readyTimeout, func() bool {
					resp, err := client.Get("https://" + addr + "/readyz")
					if err == nil {
						resp.Body.Close()
					}
					return err == nil && resp.StatusCode == http.StatusOK
				}) {
					t.Fatalf("control plane %d not ready:\n%s", i, p.Output())
				}
				f.cps = append(f.cps, &controlPlane{Proc: p, addr: addr})
			}
			v := putOverTLS(t, client, f.cps[0].addr, fleetPolicy)
			f.startProxies(t, kind, v, "envoy/envoy-mtls.yaml", func(i int) (map[string]string, []string) {
				dir := filepath.Join(pki, "proxy-"+strconv.Itoa(i))
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				crt, key := ca.Issue(t, testpki.Leaf{CommonName: "envoy", URIs: []string{"spiffe://sluice.test/ns/e2e/sa/proxy-" + strconv.Itoa(i)}}).Write(t, dir, "envoy")
				// No token at all: the certificate names the proxy.
				return map[string]string{"/etc/sluice/tls/envoy.crt": crt, "/etc/sluice/tls/envoy.key": key,
					"/etc/sluice/tls/ca.crt": ca.WriteCA(t, dir, "ca")}, []string{"SLUICE_READ_TOKEN=", "SLUICE_QUOTA_TOKEN="}
			})
			f.send(t, "mtls", 900)
			if got := f.awaitLogged(t, "mtls", 900); got != fleetLimit {
				t.Errorf("900 requests over three proxies over mTLS: the logs show %d admitted, want exactly %d", got, fleetLimit)
			}
			// No token was configured: the quota calls were authenticated by
			// the certificates (a call without a SAN would be 403 no_identity).
			var calls float64
			for _, cp := range f.cps {
				calls += metricOverTLS(t, client, cp.addr, `sluice_controlplane_quota_request_duration_seconds_count{code="200"}`)
			}
			if calls == 0 {
				t.Error("no quota call was answered 200")
			}
			t.Logf("%.0f quota calls answered 200, each authenticated by the proxy's certificate", calls)
		})
	}
}

// putOverTLS stores doc as policy default through client and returns its version.
func putOverTLS(t *testing.T, client *http.Client, addr, doc string) uint64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "https://"+addr+"/v1/policies/default", strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Version uint64 }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Version == 0 {
		t.Fatalf("PUT policy over TLS: %s %v", resp.Status, err)
	}
	return out.Version
}

// metricOverTLS returns the value of the sample line starting with name on the
// control plane's /metrics, 0 when there is none.
func metricOverTLS(t *testing.T, client *http.Client, addr, name string) float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, l)
			}
			return f
		}
	}
	return 0
}
