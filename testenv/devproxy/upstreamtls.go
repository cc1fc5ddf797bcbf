package devproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

const tlsSocketName = "envoy.transport_sockets.tls"

// UpstreamTLS is what the dev proxy takes from a cluster's transport socket
// envoy.transport_sockets.tls, an UpstreamTlsContext
// (api/envoy/extensions/transport_sockets/tls/v3/tls.proto): the connections to
// the cluster are TLS, presenting the client certificate if one is given.
type UpstreamTLS struct {
	// SNI is sni: the server name sent; empty sends none.
	SNI string
	// Cert and Key are common_tls_context.tls_certificates[0]'s certificate_chain
	// and private_key; zero: no client certificate.
	Cert, Key Source
	// TrustedCA is validation_context.trusted_ca. Zero: the server's certificate
	// is not verified, as Envoy does not verify it without a validation context.
	TrustedCA Source
	// SANs are validation_context.match_typed_subject_alt_names: the server
	// certificate must have a SAN of the type that the matcher accepts (any one).
	SANs []SANMatcher
	// MinVersion and MaxVersion are tls_params' protocol versions (crypto/tls
	// constants), by default TLS 1.2 and TLS 1.2: Envoy's documented defaults for
	// clients (TlsParameters, api/envoy/extensions/transport_sockets/tls/v3/common.proto).
	MinVersion, MaxVersion uint16
}

// Source is an Envoy DataSource: a file, read when the proxy starts (ClientConfig),
// or inline bytes.
type Source struct {
	// Filename is the DataSource's filename: a path, read by ClientConfig.
	Filename string
	// Inline is its inline_string or inline_bytes; nil when Filename is set.
	Inline []byte
}

func (s Source) zero() bool { return s.Filename == "" && s.Inline == nil }

func (s Source) read() ([]byte, error) {
	if s.Filename != "" {
		return os.ReadFile(s.Filename)
	}
	return s.Inline, nil
}

// SANMatcher is one SubjectAltNameMatcher: a SAN type (DNS, URI, IP_ADDRESS,
// EMAIL) and a string matcher (exact, prefix, suffix or contains).
type SANMatcher struct {
	// Type is san_type's name: "DNS", "URI", "IP_ADDRESS" or "EMAIL".
	Type string
	// Exact, Prefix, Suffix and Contains are the StringMatcher's one set
	// member (type/matcher/v3/string.proto); the others are empty.
	Exact, Prefix, Suffix, Contains string
	// IgnoreCase is ignore_case: compare in lower case.
	IgnoreCase bool
}

func (c *EnvoyConfig) upstreamTLS(cl *clusterv3.Cluster) error {
	ts := cl.GetTransportSocket()
	if ts == nil {
		return nil
	}
	p := "cluster " + cl.GetName() + ".transport_socket"
	if ts.GetName() != tlsSocketName && ts.GetTypedConfig().GetTypeUrl() != "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext" {
		return fmt.Errorf("%w: %s: only %s is supported by the dev proxy", ErrEnvoyConfig, p, tlsSocketName)
	}
	utc := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(utc); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrEnvoyConfig, p, err)
	}
	u := &UpstreamTLS{SNI: utc.GetSni(), MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12}
	ctx := utc.GetCommonTlsContext()
	versions := map[tlsv3.TlsParameters_TlsProtocol]uint16{tlsv3.TlsParameters_TLSv1_0: tls.VersionTLS10,
		tlsv3.TlsParameters_TLSv1_1: tls.VersionTLS11, tlsv3.TlsParameters_TLSv1_2: tls.VersionTLS12, tlsv3.TlsParameters_TLSv1_3: tls.VersionTLS13}
	if v, ok := versions[ctx.GetTlsParams().GetTlsMinimumProtocolVersion()]; ok {
		u.MinVersion = v
	}
	if v, ok := versions[ctx.GetTlsParams().GetTlsMaximumProtocolVersion()]; ok {
		u.MaxVersion = v
	}
	if u.MinVersion > u.MaxVersion {
		return fmt.Errorf("%w: %s: tls_params: the minimum protocol version is above the maximum", ErrEnvoyConfig, p)
	}
	if certs := ctx.GetTlsCertificates(); len(certs) > 0 {
		var err error
		if u.Cert, err = dataSource(certs[0].GetCertificateChain()); err != nil {
			return fmt.Errorf("%w: %s: certificate_chain: %v", ErrEnvoyConfig, p, err)
		}
		if u.Key, err = dataSource(certs[0].GetPrivateKey()); err != nil {
			return fmt.Errorf("%w: %s: private_key: %v", ErrEnvoyConfig, p, err)
		}
	}
	if len(ctx.GetTlsCertificateSdsSecretConfigs()) > 0 || ctx.GetValidationContextSdsSecretConfig() != nil {
		return fmt.Errorf("%w: %s: SDS secrets are not supported by the dev proxy; give the files (tls_certificates, validation_context)", ErrEnvoyConfig, p)
	}
	if vc := ctx.GetValidationContext(); vc != nil {
		if vc.GetTrustedCa() != nil {
			var err error
			if u.TrustedCA, err = dataSource(vc.GetTrustedCa()); err != nil {
				return fmt.Errorf("%w: %s: trusted_ca: %v", ErrEnvoyConfig, p, err)
			}
		}
		for _, m := range vc.GetMatchTypedSubjectAltNames() {
			sm := m.GetMatcher()
			if sm.GetSafeRegex() != nil {
				return fmt.Errorf("%w: %s: a safe_regex SAN matcher is not supported by the dev proxy", ErrEnvoyConfig, p)
			}
			u.SANs = append(u.SANs, SANMatcher{Type: m.GetSanType().String(), Exact: sm.GetExact(), Prefix: sm.GetPrefix(),
				Suffix: sm.GetSuffix(), Contains: sm.GetContains(), IgnoreCase: sm.GetIgnoreCase()})
		}
	}
	if u.TrustedCA.zero() && len(u.SANs) > 0 {
		return fmt.Errorf("%w: %s: match_typed_subject_alt_names needs a trusted_ca", ErrEnvoyConfig, p)
	}
	c.ClusterTLS[cl.GetName()] = u
	return nil
}

func dataSource(d *corev3.DataSource) (Source, error) {
	switch {
	case d == nil:
		return Source{}, errors.New("missing")
	case d.GetFilename() != "":
		return Source{Filename: d.GetFilename()}, nil
	case d.GetInlineString() != "":
		return Source{Inline: []byte(d.GetInlineString())}, nil
	case len(d.GetInlineBytes()) > 0:
		return Source{Inline: d.GetInlineBytes()}, nil
	}
	return Source{}, errors.New("only filename, inline_string or inline_bytes are supported by the dev proxy")
}

// ClientConfig reads the files and returns the tls.Config of connections to the
// cluster: the protocol versions of tls_params, no ALPN (HTTP/1.1,
// as an Envoy cluster without http2_protocol_options), the client certificate, and
// with a trusted CA the server's chain verified against it and its SANs matched,
// the host name not (Envoy checks names only through the SAN matchers).
func (u *UpstreamTLS) ClientConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: u.MinVersion, MaxVersion: u.MaxVersion, ServerName: u.SNI, InsecureSkipVerify: true}
	if cfg.MinVersion == 0 {
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	}
	if !u.Cert.zero() {
		certPEM, err := u.Cert.read()
		if err != nil {
			return nil, fmt.Errorf("certificate_chain: %w", err)
		}
		keyPEM, err := u.Key.read()
		if err != nil {
			return nil, fmt.Errorf("private_key: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		// Presented whatever CAs the server names, as Envoy presents its certificate.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	if u.TrustedCA.zero() {
		return cfg, nil
	}
	caPEM, err := u.TrustedCA.read()
	if err != nil {
		return nil, fmt.Errorf("trusted_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("trusted_ca holds no PEM certificate")
	}
	sans := u.SANs
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("devproxy: the upstream sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		leaf := cs.PeerCertificates[0]
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter}); err != nil {
			return err
		}
		if len(sans) == 0 {
			return nil
		}
		for _, m := range sans {
			if m.matchesAny(leaf) {
				return nil
			}
		}
		return errors.New("devproxy: the upstream certificate matches none of match_typed_subject_alt_names")
	}
	return cfg, nil
}

func (m SANMatcher) matchesAny(c *x509.Certificate) bool {
	var names []string
	switch m.Type {
	case "DNS":
		names = c.DNSNames
	case "URI":
		for _, u := range c.URIs {
			names = append(names, u.String())
		}
	case "IP_ADDRESS":
		for _, ip := range c.IPAddresses {
			names = append(names, ip.String())
		}
	case "EMAIL":
		names = c.EmailAddresses
	}
	for _, n := range names {
		if m.match(n) {
			return true
		}
	}
	return false
}

func (m SANMatcher) match(s string) bool {
	fold := func(x string) string {
		if m.IgnoreCase {
			return strings.ToLower(x)
		}
		return x
	}
	s = fold(s)
	switch {
	case m.Exact != "":
		return s == fold(m.Exact)
	case m.Prefix != "":
		return strings.HasPrefix(s, fold(m.Prefix))
	case m.Suffix != "":
		return strings.HasSuffix(s, fold(m.Suffix))
	case m.Contains != "":
		return strings.Contains(s, fold(m.Contains))
	}
	return false
}
