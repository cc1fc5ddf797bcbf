package app

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

const (
	idA     = "spiffe://cluster.local/ns/edge/sa/envoy-a"
	idB     = "spiffe://cluster.local/ns/other/sa/envoy-b"
	tightFW = `{"policy":"p","rules":[{"id":"fw","algorithm":"fixed_window","limit":300,"window":"1h","scope":"fleet"}]}`
	looseFW = `{"policy":"p","rules":[{"id":"fw","algorithm":"fixed_window","limit":100000000,"window":"1h","scope":"fleet"}]}`
	fwKey   = "rl:default:p/fw:*:3600s"
)

// tlsPlane is a control plane serving HTTPS with a client CA, and its PKI.
type tlsPlane struct {
	url string
	ca  *testpki.CA
}

// startTLSPlane starts a control plane on HTTPS whose client CA is a fresh CA, with
// the admin token "adm" and policy doc applied; extra are further flags.
func startTLSPlane(t *testing.T, doc string, extra ...string) *tlsPlane {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "envoys and control plane")
	certFile, keyFile := ca.Server(t).Write(t, dir, "server")
	args := append([]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--client-ca-file", ca.WriteCA(t, dir, "ca")}, extra...)
	a, _ := serve(t, args, map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_DATA_DIR": dir})
	p := &tlsPlane{url: "https://" + a.String(), ca: ca}
	req, _ := http.NewRequest("PUT", p.url+"/v1/policies/p", strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer adm")
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client(t, nil).Do(req) // the admin API needs no client certificate
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("PUT policy over TLS → %d", resp.StatusCode)
	}
	return p
}

// client returns an HTTPS client trusting the plane's CA, presenting cert if not nil.
func (p *tlsPlane) client(t *testing.T, cert *testpki.Cert) *http.Client {
	cfg := &tls.Config{RootCAs: p.ca.Pool()}
	if cert != nil {
		// Always presented, whatever CAs the server names (Go's client would
		// otherwise send none for a certificate of another CA).
		c := cert.TLS(t)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 16}}
}

// envoy returns a client presenting a certificate of the plane's CA with URI SAN id.
func (p *tlsPlane) envoy(t *testing.T, id string) *http.Client {
	c := p.ca.Issue(t, testpki.Leaf{CommonName: "envoy", URIs: []string{id}})
	return p.client(t, &c)
}

type keyAnswer struct {
	Status   string `json:"status"`
	Granted  uint64 `json:"granted"`
	Returned uint64 `json:"returned"`
	Held     uint64 `json:"held"`
}

// ask posts one quota request for fwKey and returns the status code, the key's
// answer and the error code of an error answer.
func ask(t *testing.T, c *http.Client, url, envoy string, want, used, ret uint64, hdr ...string) (int, keyAnswer, string) {
	t.Helper()
	code, k, ecode, err := tryAsk(c, url, envoy, want, used, ret, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return code, k, ecode
}

func tryAsk(c *http.Client, url, envoy string, want, used, ret uint64, hdr ...string) (int, keyAnswer, string, error) {
	body := fmt.Sprintf(`{"envoy":%q,"policy":"p","version":1,"keys":[{"rule":"fw","key":%q,"want":%d,"used":%d,"return":%d}]}`, envoy, fwKey, want, used, ret)
	req, _ := http.NewRequest("POST", url+"/v1/quota", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, keyAnswer{}, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Keys  []keyAnswer `json:"keys"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, keyAnswer{}, "", fmt.Errorf("quota answer %d %q: %v", resp.StatusCode, b, err)
	}
	var k keyAnswer
	if len(out.Keys) > 0 {
		k = out.Keys[0]
	}
	return resp.StatusCode, k, out.Error.Code, nil
}

// TestAnotherIdentityCannotReturnAnEnvoysUnits: a caller holding a valid
// certificate of its own posts another Envoy's id with a huge return. Nothing is
// credited, the other Envoy's lease is untouched, and the fleet never gets more than
// the limit in the window.
func TestAnotherIdentityCannotReturnAnEnvoysUnits(t *testing.T) {
	p := startTLSPlane(t, tightFW)
	a, b := p.envoy(t, idA), p.envoy(t, idB)
	code, k, _ := ask(t, a, p.url, "a-1", 100, 0, 0)
	if code != 200 || k.Granted != 100 {
		t.Fatalf("A asks 100 → %d %+v", code, k)
	}
	for i := 0; i < 5; i++ {
		code, k, _ = ask(t, b, p.url, "a-1", 0, 0, 1000000)
		if code != 200 || k.Returned != 0 {
			t.Fatalf("B returns A's units → %d %+v: credited", code, k)
		}
	}
	if _, k, _ = ask(t, a, p.url, "a-1", 0, 0, 0); k.Held != 100 {
		t.Fatalf("A's lease after B's returns: %+v, want held 100", k)
	}
	// B takes what is left, spending what it is granted (a lease holding
	// units unspent takes nothing of A's unclaimed share): the window's total
	// stays at the limit.
	total := uint64(100)
	var held uint64
	for i := 0; i < 50; i++ {
		_, k, _ = ask(t, b, p.url, "a-1", 300, held, 0)
		held = k.Held
		total += k.Granted
		if k.Status == "refused" {
			break
		}
	}
	if total != 300 {
		t.Fatalf("granted %d in the window, limit 300", total)
	}
}

// TestOneIdentityCannotFillAKeysLedger: one identity asking under more made-up
// Envoy ids than its cap holds its cap of live leases, and every further id is
// answered retry without touching them; another identity is still granted, and the
// newcomers kept waiting are counted.
func TestOneIdentityCannotFillAKeysLedger(t *testing.T) {
	const ids, perIdentity = 300, 256
	p := startTLSPlane(t, looseFW, "--quota-max-entries-per-identity", strconv.Itoa(perIdentity))
	b := p.envoy(t, idB)
	var wg sync.WaitGroup
	var granted, retried atomic.Int64
	var holder atomic.Value // an id that was granted
	errs := make(chan error, ids)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < ids; i += 4 {
				code, k, _, err := tryAsk(b, p.url, fmt.Sprintf("made-up-%d", i), 1, 0, 0)
				switch {
				case err != nil:
				case code == 200 && k.Granted == 1:
					granted.Add(1)
					holder.Store(fmt.Sprintf("made-up-%d", i))
				case code == 200 && k.Status == "retry" && k.Granted == 0:
					retried.Add(1)
				default:
					err = fmt.Errorf("made-up id %d → %d %+v", i, code, k)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// B's entries are active for three report intervals after their ask: while
	// they are, ids past the cap wait. (Entries that went quiet meanwhile, on a
	// slow machine, give way to later ids: each such place is one eviction.)
	m := get(t, p.client(t, nil), p.url+"/metrics", "adm")
	evictions := metricValue(t, m, "sluice_controlplane_quota_ledger_evictions_total")
	if granted.Load() != perIdentity+evictions || retried.Load() != ids-granted.Load() || retried.Load() == 0 {
		t.Fatalf("B's %d ids: %d granted, %d retry, %d evictions; want %d granted plus one per eviction, the rest retry",
			ids, granted.Load(), retried.Load(), evictions, perIdentity)
	}
	t.Logf("B's %d ids: %d granted, %d retry, %d evictions", ids, granted.Load(), retried.Load(), evictions)
	if full := metricValue(t, m, `sluice_controlplane_quota_ledger_full_total{scope="identity"}`); full != retried.Load() {
		t.Fatalf("ledger_full{identity} = %d, want %d", full, retried.Load())
	}
	// B's leases are intact: an id that was granted still holds its unit.
	if _, k, _ := ask(t, b, p.url, holder.Load().(string), 0, 0, 0); evictions == 0 && k.Held != 1 {
		t.Fatalf("B's lease of %s after the flood: %+v, want held 1", holder.Load(), k)
	}
	a := p.envoy(t, idA)
	for i := 0; i < 20; i++ {
		if code, k, _ := ask(t, a, p.url, fmt.Sprintf("a-%d", i), 10, 0, 0); code != 200 || k.Granted != 10 {
			t.Fatalf("A (Envoy a-%d) after B's %d ids → %d %+v", i, ids, code, k)
		}
	}
}

// TestQuotaNeedsAVerifiedClientCertificate: with a client CA, a quota call without
// a certificate is 401, one with a certificate of another CA or an expired one does
// not complete its handshake, one without a URI or DNS name is 403. The admin API
// keeps its token and needs no certificate.
func TestQuotaNeedsAVerifiedClientCertificate(t *testing.T) {
	p := startTLSPlane(t, tightFW)
	if code, _, ecode := ask(t, p.client(t, nil), p.url, "e", 1, 0, 0); code != 401 || ecode != "client_certificate_required" {
		t.Fatalf("no certificate → %d %s", code, ecode)
	}
	other := testpki.NewCA(t, "someone else")
	wrong := other.Issue(t, testpki.Leaf{URIs: []string{idA}})
	if _, _, _, err := tryAsk(p.client(t, &wrong), p.url, "e", 1, 0, 0); err == nil {
		t.Fatal("a certificate of another CA was accepted")
	}
	expired := p.ca.Issue(t, testpki.Leaf{URIs: []string{idA}, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if _, _, _, err := tryAsk(p.client(t, &expired), p.url, "e", 1, 0, 0); err == nil {
		t.Fatal("an expired certificate was accepted")
	}
	anon := p.ca.Issue(t, testpki.Leaf{CommonName: "no-san"})
	if code, _, ecode := ask(t, p.client(t, &anon), p.url, "e", 1, 0, 0); code != 403 || ecode != "no_identity" {
		t.Fatalf("no SAN → %d %s", code, ecode)
	}
	dns := p.ca.Issue(t, testpki.Leaf{DNS: []string{"envoy-1.edge.svc"}})
	if code, k, _ := ask(t, p.client(t, &dns), p.url, "e", 1, 0, 0); code != 200 || k.Granted != 1 {
		t.Fatalf("DNS SAN → %d %+v", code, k)
	}
	if b := get(t, p.client(t, nil), p.url+"/v1/policies/p", "adm"); !bytes.Contains(b, []byte(`"policy":"p"`)) {
		t.Fatalf("admin read over TLS: %s", b)
	}
}

// TestSpoofedXFCCIsIgnoredWithoutTrustXFCC: an x-forwarded-client-cert header naming
// another identity changes nothing unless --trust-xfcc is set: the certificate
// decides.
func TestSpoofedXFCCIsIgnoredWithoutTrustXFCC(t *testing.T) {
	p := startTLSPlane(t, tightFW)
	a, b := p.envoy(t, idA), p.envoy(t, idB)
	if _, k, _ := ask(t, a, p.url, "a-1", 100, 0, 0); k.Granted != 100 {
		t.Fatalf("A asks 100 → %+v", k)
	}
	xfcc := `By=spiffe://cluster.local/ns/sluice/sa/controlplane;Hash=00;URI=` + idA
	if _, k, _ := ask(t, b, p.url, "a-1", 0, 0, 100, "X-Forwarded-Client-Cert", xfcc); k.Returned != 0 {
		t.Fatalf("B posing as A by XFCC → %+v: credited", k)
	}
	if _, k, _ := ask(t, a, p.url, "a-1", 0, 0, 0); k.Held != 100 {
		t.Fatalf("A's lease: %+v, want held 100", k)
	}
}

// xfccPlane starts a control plane with --trust-xfcc, the quota token "qt" and
// the policy tightFW, and returns its URL and a client.
func xfccPlane(t *testing.T) (string, *http.Client) {
	t.Helper()
	a, _ := serve(t, []string{"--trust-xfcc"}, map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_QUOTA_TOKEN": "qt", "SLUICE_DATA_DIR": t.TempDir()})
	url := "http://" + a.String()
	c := &http.Client{Timeout: 30 * time.Second}
	req, _ := http.NewRequest("PUT", url+"/v1/policies/p", strings.NewReader(tightFW))
	req.Header.Set("Authorization", "Bearer adm")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := c.Do(req); err != nil || resp.StatusCode != 201 {
		t.Fatalf("PUT policy: %v %v", resp, err)
	}
	return url, c
}

// TestTrustXFCCIdentifiesBySidecarHeader: behind a sidecar that terminates mTLS,
// --trust-xfcc keys the ledger by the header's URI; a call without it is 401.
func TestTrustXFCCIdentifiesBySidecarHeader(t *testing.T) {
	url, c := xfccPlane(t)
	auth := []string{"Authorization", "Bearer qt"}
	fromA := append(auth, "X-Forwarded-Client-Cert", `By=spiffe://cluster.local/ns/sluice/sa/cp;Hash=ab;Subject="CN=a,O=x";URI=`+idA)
	fromB := append(auth, "X-Forwarded-Client-Cert", `By=spiffe://cluster.local/ns/sluice/sa/cp;Hash=cd;URI=`+idB)
	if code, k, _ := ask(t, c, url, "e-1", 100, 0, 0, fromA...); code != 200 || k.Granted != 100 {
		t.Fatalf("A → %d %+v", code, k)
	}
	if _, k, _ := ask(t, c, url, "e-1", 0, 0, 100, fromB...); k.Returned != 0 || k.Held != 0 {
		t.Fatalf("B under A's Envoy id → %+v", k)
	}
	if _, k, _ := ask(t, c, url, "e-1", 0, 0, 40, fromA...); k.Returned != 40 || k.Held != 60 {
		t.Fatalf("A returns its own → %+v", k)
	}
	if code, _, ecode := ask(t, c, url, "e-1", 1, 0, 0, auth...); code != 401 || ecode != "client_certificate_required" {
		t.Fatalf("no XFCC → %d %s", code, ecode)
	}
	// The header alone does not authenticate: the quota token is still required.
	if code, _, _ := ask(t, c, url, "e-1", 1, 0, 0, fromA[2:]...); code != 401 {
		t.Fatalf("XFCC without the quota token → %d", code)
	}
}

// TestXFCCPrefixFromTheClientCannotActOnAnotherIdentitysLease: with --trust-xfcc,
// a client that opens a quote ahead of the element its sidecar appends
// (APPEND_FORWARD) is refused; it neither returns nor reads the victim's units.
func TestXFCCPrefixFromTheClientCannotActOnAnotherIdentitysLease(t *testing.T) {
	url, c := xfccPlane(t)
	victim := []string{"Authorization", "Bearer qt", "X-Forwarded-Client-Cert", `By=spiffe://cluster.local/ns/sluice/sa/cp;Hash=ab;Subject="";URI=` + idA}
	if code, k, _ := ask(t, c, url, "e-1", 50, 0, 0, victim...); code != 200 || k.Granted != 50 {
		t.Fatalf("victim → %d %+v", code, k)
	}
	forged := `URI=` + idA + `;X=",By=spiffe://cluster.local/ns/sluice/sa/cp;Hash=cd;Subject="";URI=` + idB
	code, k, ecode := ask(t, c, url, "e-1", 0, 0, 40, "Authorization", "Bearer qt", "X-Forwarded-Client-Cert", forged)
	if code != 401 || ecode != "client_certificate_required" || k.Returned != 0 {
		t.Fatalf("attacker with a quote-opening prefix → %d %s %+v, want 401 and nothing returned", code, ecode, k)
	}
	if _, k, _ := ask(t, c, url, "e-1", 0, 0, 0, victim...); k.Held != 50 {
		t.Fatalf("victim's lease after the attempt: %+v, want held 50", k)
	}
}

// TestTLSCertificateReloadedWhenItsFilesChange: a certificate renewed on disk is
// served from the next handshake; files that change into garbage leave the last
// good one in service.
func TestTLSCertificateReloadedWhenItsFilesChange(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "rotating")
	certFile, keyFile := ca.Server(t).Write(t, dir, "server")
	a, _ := serve(t, []string{"--tls-cert-file", certFile, "--tls-key-file", keyFile}, map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_DATA_DIR": dir})
	served := func() string {
		conn, err := tls.Dial("tcp", a.String(), &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := served()
	renewed := ca.Server(t)
	renewed.Write(t, dir, "server")
	if got := served(); got != renewed.Leaf.SerialNumber.String() {
		t.Fatalf("after renewal the server presents serial %s, want %s (was %s)", got, renewed.Leaf.SerialNumber, first)
	}
	testpki.WriteFile(t, certFile, []byte("not a certificate"))
	if got := served(); got != renewed.Leaf.SerialNumber.String() {
		t.Fatalf("after a bad write the server presents %s, want the last good %s", got, renewed.Leaf.SerialNumber)
	}
	if _, err := tls.Dial("tcp", a.String(), &tls.Config{RootCAs: ca.Pool(), MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("TLS 1.1 accepted")
	}
}

func get(t *testing.T, c *http.Client, url, token string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// metricValue returns the value of the series named exactly name (with its
// labels) in a Prometheus text exposition.
func metricValue(t *testing.T, exposition []byte, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(string(exposition), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return int64(n)
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// TestAProxyTheControlPlaneCanNameReadsWithoutAToken: where the control plane
// verifies who a proxy is (its client certificate under --client-ca-file, its
// sidecar's x-forwarded-client-cert under --trust-xfcc), a poll without a read
// token is served, so a mesh needs no token in any proxy; a caller it cannot
// name is 401, and a write still needs the admin token.
func TestAProxyTheControlPlaneCanNameReadsWithoutAToken(t *testing.T) {
	status := func(c *http.Client, method, url string, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(tightFW))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	p := startTLSPlane(t, tightFW)
	if got := status(p.envoy(t, idA), "GET", p.url+"/v1/policies/p"); got != 200 {
		t.Errorf("a proxy with a verified certificate, no token: GET → %d, want 200", got)
	}
	if got := status(p.client(t, nil), "GET", p.url+"/v1/policies/p"); got != 401 {
		t.Errorf("no certificate, no token: GET → %d, want 401", got)
	}
	if got := status(p.envoy(t, idA), "PUT", p.url+"/v1/policies/p"); got != 401 {
		t.Errorf("a verified certificate without the admin token: PUT → %d, want 401", got)
	}

	url, c := xfccPlane(t)
	xfcc := `By=spiffe://cluster.local/ns/sluice/sa/cp;Hash=ab;URI=` + idA
	if got := status(c, "GET", url+"/v1/policies/p", "X-Forwarded-Client-Cert", xfcc); got != 200 {
		t.Errorf("behind the sidecar, no token: GET → %d, want 200", got)
	}
	if got := status(c, "GET", url+"/v1/policies/p", "X-Forwarded-Client-Cert", `URI=`+idA+`;X="`); got != 401 {
		t.Errorf("a malformed x-forwarded-client-cert: GET → %d, want 401", got)
	}
	if got := status(c, "GET", url+"/v1/policies/p"); got != 401 {
		t.Errorf("no header, no token: GET → %d, want 401", got)
	}
	if got := status(c, "PUT", url+"/v1/policies/p", "X-Forwarded-Client-Cert", xfcc); got != 401 {
		t.Errorf("behind the sidecar without the admin token: PUT → %d, want 401", got)
	}
}
