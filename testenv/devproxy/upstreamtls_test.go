package devproxy

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

// mtlsConfig is envoy/envoy-mtls.yaml with its certificate files in dir.
func mtlsConfig(t *testing.T, dir string) *EnvoyConfig {
	t.Helper()
	doc, err := os.ReadFile("../../envoy/envoy-mtls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseEnvoyConfig(bytes.ReplaceAll(doc, []byte("/etc/sluice/tls/"), []byte(dir+"/")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUpstreamTLSFollowsTheClusterSocket: the control_plane cluster's
// UpstreamTlsContext presents the Envoy's certificate and accepts only a server
// certificate of its trusted CA whose SAN matches; a server of another CA, or of
// the same CA under another name, fails the call.
func TestUpstreamTLSFollowsTheClusterSocket(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster")
	ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://test/envoy"}}).Write(t, dir, "envoy")
	ca.WriteCA(t, dir, "ca")
	c := mtlsConfig(t, dir)
	u := c.ClusterTLS["control_plane"]
	if u == nil || u.SNI != "sluice-controlplane" || u.MinVersion != tls.VersionTLS12 {
		t.Fatalf("control_plane TLS %+v", u)
	}
	cfg, err := u.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	var sawURI, sawSNI string
	serve := func(cert testpki.Cert) string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(r.TLS.PeerCertificates) > 0 && len(r.TLS.PeerCertificates[0].URIs) > 0 {
				sawURI = r.TLS.PeerCertificates[0].URIs[0].String()
			}
			sawSNI = r.TLS.ServerName
			io.WriteString(w, "ok")
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS(t)}, ClientAuth: tls.RequireAnyClientCert}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	get := func(url string) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg.Clone()}}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	good := serve(ca.Issue(t, testpki.Leaf{DNS: []string{"sluice-controlplane"}}))
	if err := get(good); err != nil {
		t.Fatalf("the control plane of the trusted CA, named right: %v", err)
	}
	if sawURI != "spiffe://test/envoy" || sawSNI != "sluice-controlplane" {
		t.Fatalf("server saw client URI %q, SNI %q", sawURI, sawSNI)
	}
	if err := get(serve(ca.Issue(t, testpki.Leaf{DNS: []string{"someone-else"}}))); err == nil || !strings.Contains(err.Error(), "match_typed_subject_alt_names") {
		t.Fatalf("a server named otherwise: %v", err)
	}
	other := testpki.NewCA(t, "other")
	if err := get(serve(other.Issue(t, testpki.Leaf{DNS: []string{"sluice-controlplane"}}))); err == nil {
		t.Fatal("a server of another CA was accepted")
	}
	// A file the socket names that is missing fails the proxy's start, naming it.
	if err := os.Remove(filepath.Join(dir, "envoy.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := u.ClientConfig(); err == nil || !strings.Contains(err.Error(), "private_key") {
		t.Fatalf("missing key: %v", err)
	}
}
