package quota

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestXFCCIdentityTakesTheNearestElementsURIThenDNS(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{`By=spiffe://td/cp;Hash=ab;URI=spiffe://td/ns/a/sa/e`}, "spiffe://td/ns/a/sa/e"},
		{[]string{`by=x;hash=1;uri=spiffe://td/lower`}, "spiffe://td/lower"},
		{[]string{`Hash=1;DNS=e1.svc;DNS=e2.svc`}, "e1.svc"},
		{[]string{`Hash=1;DNS=e1.svc;URI=spiffe://td/u`}, "spiffe://td/u"},
		{[]string{`Hash=1;URI=;DNS=e1.svc`}, "e1.svc"},
		// The last element is the nearest proxy's: an earlier hop's claim is not it.
		{[]string{`URI=spiffe://td/far,URI=spiffe://td/near`}, "spiffe://td/near"},
		{[]string{`URI=spiffe://td/far, URI=spiffe://td/near`}, "spiffe://td/near"},
		// Repeated headers are one header joined with ",".
		{[]string{`URI=spiffe://td/first-header`, `Hash=2;URI=spiffe://td/second-header`}, "spiffe://td/second-header"},
		// Quoted values may hold , ; = and escaped quotes.
		{[]string{`Subject="CN=a,O=b;c";URI="spiffe://td/q"`}, "spiffe://td/q"},
		{[]string{`URI=spiffe://td/x,Subject="O=\"a,b\"";DNS=n.svc`}, "n.svc"},
		// What Envoy writes with Istio's settings (Subject, URI and DNS).
		{[]string{`By=spiffe://td/ns/cp/sa/cp;Hash=3f2a;Subject="";URI=spiffe://td/ns/a/sa/e;DNS=e.a.svc`}, "spiffe://td/ns/a/sa/e"},
		{[]string{`By=spiffe://td/x;Hash=1;Cert="-----BEGIN%20CERTIFICATE-----";Chain="x%0Ay";URI=spiffe://td/c`}, "spiffe://td/c"},
	} {
		got, err := XFCCIdentity(c.in)
		if err != nil || got != c.want {
			t.Errorf("XFCCIdentity(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestXFCCIdentityRefusesAHeaderThatDoesNotParseWhole(t *testing.T) {
	for _, in := range [][]string{
		nil,
		{""},
		{`Hash=1;Subject="CN=x"`},
		{`URI=`},
		{`URI=spiffe://td/a;X="`},
		{`URI=spiffe://td/a,`},
		{`,URI=spiffe://td/a`},
		{`URI=spiffe://td/a;;Hash=1`},
		{`URI=spiffe://td/a;Hash`},
		{`URI=spiffe://td/a;Foo=1`},
		{`URI=spiffe://td/a;Subject="x"y`},
		{`URI=spiffe://td/a;Subject=x"y`},
		{`URI="spiffe://td/a`},
		{`URI="spiffe://td/a\"`},
		// A malformed earlier element spoils the header, even when the last is fine.
		{`Foo=bar,URI=spiffe://td/a`},
		{`URI=spiffe://td/v;Subject="`, `Hash=1;URI=spiffe://td/a`},
	} {
		if got, err := XFCCIdentity(in); err == nil || !errors.Is(err, ErrXFCC) {
			t.Errorf("XFCCIdentity(%q) = %q, %v; want an ErrXFCC", in, got, err)
		}
	}
}

// envoyXFCCElement is the element Envoy's APPEND_FORWARD writes for a peer
// certificate with this subject and URI SAN under Istio's settings (By, Hash,
// Subject, URI): the subject in RFC 2253 form, whose specials are
// backslash-escaped (conn_manager_utility.cc quotes it as it is).
func envoyXFCCElement(subject, uri string) string {
	var b strings.Builder
	for i := 0; i < len(subject); i++ {
		if strings.IndexByte(`",+;<>\`, subject[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(subject[i])
	}
	return `By=spiffe://td/ns/cp/sa/controlplane;Hash=9f86d081884c7d65;Subject="` + b.String() + `";URI=` + uri
}

func TestXFCCUnterminatedQuoteFromTheClientCannotClaimAnotherIdentity(t *testing.T) {
	client := `URI=spiffe://td/ns/prod/sa/victim;X="`
	sidecar := `By=spiffe://td/ns/cp/sa/cp;Hash=ab12;Subject="";URI=spiffe://td/ns/dev/sa/attacker`
	got, err := XFCCIdentity([]string{client + "," + sidecar})
	if err == nil {
		t.Fatalf("identity %q: a header with an unterminated quote was accepted", got)
	}
}

// FuzzXFCCIdentityIsTheTrustedHopsOrNone checks that whatever a client sends ahead
// of the element its sidecar appends (APPEND_FORWARD), the identity is that
// element's URI or the header is refused.
func FuzzXFCCIdentityIsTheTrustedHopsOrNone(f *testing.F) {
	for _, s := range [][2]string{
		{`URI=spiffe://td/ns/prod/sa/victim;X="`, ""},
		{`URI=spiffe://td/ns/prod/sa/victim;Subject="`, `a"b`},
		{`URI=spiffe://td/ns/prod/sa/victim;Subject="`, `;`},
		{`URI=spiffe://td/ns/prod/sa/victim;Subject="x\`, `CN=a,O="b"`},
		{`URI=spiffe://td/v,Subject="`, `CN=x"`},
		{``, `CN=a`},
		{`By=a;URI=spiffe://td/v`, ``},
	} {
		f.Add(s[0], s[1], false)
		f.Add(s[0], s[1], true)
	}
	const attacker = "spiffe://td/ns/dev/sa/attacker"
	f.Fuzz(func(t *testing.T, prefix, subject string, twoValues bool) {
		elem := envoyXFCCElement(subject, attacker)
		in := []string{elem}
		switch {
		case prefix != "" && twoValues:
			in = []string{prefix, elem}
		case prefix != "":
			in = []string{prefix + "," + elem}
		}
		got, err := XFCCIdentity(in)
		if err == nil && got != attacker {
			t.Fatalf("XFCCIdentity(%q) = %q: the client's prefix chose the identity", in, got)
		}
		if prefix == "" && err != nil {
			t.Fatalf("XFCCIdentity(%q): the sidecar's element alone was refused: %v", in, err)
		}
	})
}

// TestXFCCIsTrustedOnlyFromTheLocalSidecar: with --trust-xfcc the header names
// the caller only when the connection comes from the pod's own sidecar (a
// loopback peer: Istio's inbound passthrough source 127.0.0.6, or 127.0.0.1);
// from any other address, someone reaching the control plane without a sidecar
// (one not injected, as on a revision-based install without istio.io/rev) wrote
// it, and the call carries no identity.
func TestXFCCIsTrustedOnlyFromTheLocalSidecar(t *testing.T) {
	s := New(Options{Backend: NewMemory(), Policies: newPolicies(t), Identity: IdentityXFCC, Token: "t"})
	const xfcc = `By=spiffe://td/ns/sluice/sa/cp;URI=spiffe://td/ns/edge/sa/gateway`
	for _, c := range []struct {
		peer string
		ok   bool
	}{{"127.0.0.6:41000", true}, {"127.0.0.1:41000", true}, {"[::1]:41000", true}, {"10.4.2.7:41000", false}, {"192.0.2.9:41000", false}} {
		r := httptest.NewRequest(http.MethodPost, "/v1/quota", nil)
		r.RemoteAddr = c.peer
		r.Header.Set("X-Forwarded-Client-Cert", xfcc)
		w := httptest.NewRecorder()
		_, code, ok := s.identify(w, r)
		if ok != c.ok {
			t.Errorf("from %s: identified %v (code %d, %s), want %v", c.peer, ok, code, w.Body.String(), c.ok)
		}
		if id, ok := RequestIdentity(IdentityXFCC, r); ok != c.ok {
			t.Errorf("RequestIdentity from %s: %q %v, want %v", c.peer, id, ok, c.ok)
		}
	}
}
