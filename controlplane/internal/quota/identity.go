package quota

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
)

// IdentityMode selects who the service believes an Envoy is.
type IdentityMode int

const (
	// IdentityBody trusts the request's "envoy" field: every holder of the quota
	// token is one trust domain (the default, and the only mode without TLS).
	IdentityBody IdentityMode = iota
	// IdentityCertificate takes the identity from the verified client certificate
	// of the TLS connection: its first URI SAN (the SPIFFE ID Istio and SPIRE issue,
	// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md), else its
	// first DNS SAN. A request without a verified certificate is 401.
	IdentityCertificate
	// IdentityXFCC takes it from the x-forwarded-client-cert header a sidecar Envoy
	// that terminated mTLS set: the last element's first URI, else its first DNS
	// (https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_conn_man/headers#x-forwarded-client-cert).
	// Safe only when that sidecar is the sole way to the control plane: anyone who
	// reaches it directly can write the header. The header is read only on a
	// connection from a loopback peer (SidecarPeer).
	IdentityXFCC
)

// SidecarPeer reports whether a connection from addr ("host:port", as
// http.Request.RemoteAddr) comes from this pod's own sidecar: a loopback
// address. Istio's sidecar forwards inbound traffic from 127.0.0.6 (its inbound
// passthrough source) to the application, so under IdentityXFCC a header on a
// connection from anywhere else was written by someone who reached the control
// plane without the sidecar (one not injected), and names nobody. (Istio's
// TPROXY interception mode keeps the client's address as the source: it does not
// work with IdentityXFCC.)
func SidecarPeer(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// DefaultMaxEntriesPerIdentity is Options.MaxEntriesPerIdentity's default.
const DefaultMaxEntriesPerIdentity = 16384

// identify returns the ledger owner of a request: "" under IdentityBody, else the
// prefix naming its identity (Owner). It answers 401 (or 403 for a certificate
// without a usable name) and reports false when the request carries none.
func (s *Service) identify(w http.ResponseWriter, r *http.Request) (owner string, code int, ok bool) {
	var id string
	switch s.o.Identity {
	case IdentityCertificate:
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			return "", writeError(w, http.StatusUnauthorized, "client_certificate_required",
				"quota calls need a client certificate signed by the control plane's client CA (--client-ca-file)", nil), false
		}
		if id = CertificateIdentity(r.TLS.VerifiedChains[0][0]); id == "" {
			return "", writeError(w, http.StatusForbidden, "no_identity",
				"the client certificate has neither a URI nor a DNS subject alternative name to identify the Envoy by", nil), false
		}
	case IdentityXFCC:
		var err error
		if !SidecarPeer(r.RemoteAddr) {
			return "", writeError(w, http.StatusUnauthorized, "client_certificate_required",
				"x-forwarded-client-cert is trusted only from this pod's own sidecar (a loopback peer such as Istio's 127.0.0.6); this call came from "+
					r.RemoteAddr+": is the control plane's sidecar injected (on a revision-based Istio, the namespace needs istio.io/rev)?", nil), false
		}
		if id, err = XFCCIdentity(r.Header.Values("X-Forwarded-Client-Cert")); err != nil {
			return "", writeError(w, http.StatusUnauthorized, "client_certificate_required",
				"quota calls need the x-forwarded-client-cert header of the mesh sidecar, with a URI or DNS in its last element (--trust-xfcc): "+err.Error(), nil), false
		}
	default:
		return "", 0, true
	}
	return Owner(id), 0, true
}

// RequestIdentity returns the identity a request proves under mode, as quota
// calls are identified (a verified client certificate's URI or DNS SAN; the last
// element of a trusted sidecar's x-forwarded-client-cert), and whether it has one.
// IdentityBody proves none. The REST API's reads use it to accept a proxy without
// a read token where the control plane can tell who it is.
func RequestIdentity(mode IdentityMode, r *http.Request) (string, bool) {
	switch mode {
	case IdentityCertificate:
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			return "", false
		}
		id := CertificateIdentity(r.TLS.VerifiedChains[0][0])
		return id, id != ""
	case IdentityXFCC:
		if !SidecarPeer(r.RemoteAddr) {
			return "", false
		}
		id, err := XFCCIdentity(r.Header.Values("X-Forwarded-Client-Cert"))
		return id, err == nil
	}
	return "", false
}

// Owner returns the ledger prefix of an identity: 16 base64url characters (96 bits)
// of its SHA-256, then "/". A ledger entry's name is the owner then the request's
// "envoy" field, so an identity reaches only entries of its own, and the stored
// name stays short whatever the identity's length.
func Owner(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return base64.RawURLEncoding.EncodeToString(sum[:12]) + "/"
}

// CertificateIdentity returns the identity of a verified client certificate: its
// first URI SAN (a SPIFFE ID), else its first DNS SAN; "" when it has neither.
func CertificateIdentity(leaf *x509.Certificate) string {
	switch {
	case len(leaf.URIs) > 0:
		return leaf.URIs[0].String()
	case len(leaf.DNSNames) > 0:
		return leaf.DNSNames[0]
	}
	return ""
}

// TokenOK reports whether token is the quota token (Options.Token, non-empty),
// compared in constant time over its SHA-256.
func (s *Service) TokenOK(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return s.o.Token != "" && subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1
}

// TokenRequired reports whether calls must carry the quota token: a token is
// configured, or none is and the service is not open (then no call is allowed,
// unless identities come from a trusted sidecar's header).
func (s *Service) TokenRequired() (required, refuseAll bool) {
	switch {
	case s.o.Identity == IdentityCertificate:
		return false, false
	case s.o.Token != "":
		return true, false
	case s.o.Open || s.o.Identity == IdentityXFCC:
		return false, false
	}
	return false, true
}

// Identity returns the service's identity mode (Options.Identity).
func (s *Service) Identity() IdentityMode { return s.o.Identity }
