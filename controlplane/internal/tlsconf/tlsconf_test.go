package tlsconf

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

func serverFiles(t testing.TB) (*testpki.CA, Files) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "tlsconf")
	cert, key := ca.Server(t).Write(t, dir, "server")
	return ca, Files{CertFile: cert, KeyFile: key, ClientCAFile: ca.WriteCA(t, dir, "ca")}
}

// handshake runs one TLS handshake over a loopback pipe and returns the client's
// connection state and the server's error.
func handshake(cfg *tls.Config, client *tls.Config) (tls.ConnectionState, error, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srvErr := make(chan error, 1)
	go func() {
		s := tls.Server(b, cfg)
		srvErr <- s.Handshake()
	}()
	c := tls.Client(a, client)
	err := c.Handshake()
	if err != nil {
		a.Close()
	}
	return c.ConnectionState(), err, <-srvErr
}

func TestNewNamesTheBadFile(t *testing.T) {
	_, f := serverFiles(t)
	bad := f
	bad.ClientCAFile = filepath.Join(t.TempDir(), "missing.crt")
	if _, err := New(bad, nil); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Fatalf("missing CA file: %v", err)
	}
	if err := os.WriteFile(f.KeyFile, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(f, nil); err == nil {
		t.Fatal("a bad key was accepted")
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestClientCertificateVerifiedWhenGiven(t *testing.T) {
	ca, f := serverFiles(t)
	s, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert := ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://t/e"}}).TLS(t)
	st, cerr, serr := handshake(s.Config(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{cert}})
	if cerr != nil || serr != nil || st.Version < tls.VersionTLS12 {
		t.Fatalf("handshake: %v %v %x", cerr, serr, st.Version)
	}
	if _, cerr, serr := handshake(s.Config(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}); cerr != nil || serr != nil {
		t.Fatalf("no client certificate is allowed at the TLS layer: %v %v", cerr, serr)
	}
	if s.Handshakes() != 2 {
		t.Fatalf("handshakes %d", s.Handshakes())
	}
}

// BenchmarkHandshake is the cost of one full TLS 1.3 handshake with a client
// certificate (ECDSA P-256 on both sides, no resumption), client and server on one
// machine: what an Envoy pays per new connection to the control plane.
func BenchmarkHandshake(b *testing.B) {
	ca, f := serverFiles(b)
	s, err := New(f, nil)
	if err != nil {
		b.Fatal(err)
	}
	cert := ca.Issue(b, testpki.Leaf{URIs: []string{"spiffe://t/e"}}).TLS(b)
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{cert}}
	cfg := s.Config()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, cerr, serr := handshake(cfg, client); cerr != nil || serr != nil {
			b.Fatal(cerr, serr)
		}
	}
}
