package devproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
)

var (
	wasmOnce sync.Once
	wasmBin  []byte
	wasmErr  error
)

// filterWasm builds the real filter once per test binary, as `make wasm`
// does.
func filterWasm(t *testing.T) []byte {
	t.Helper()
	wasmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "devproxy-wasm")
		if err != nil {
			wasmErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "sluice.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./filter")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			wasmErr = &buildError{err: err, out: b}
			return
		}
		wasmBin, wasmErr = os.ReadFile(out)
	})
	if wasmErr != nil {
		t.Fatalf("building the filter: %v", wasmErr)
	}
	return wasmBin
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

// perIPPolicy is a static plugin configuration: one request per client IP
// per hour.
const perIPPolicy = `{"env":"dev","policy":{"policy":"p","rules":[{"id":"ip","key":["client_ip"],
	"algorithm":"fixed_window","limit":1,"window":"1h"}]}}`

// proxyFor starts the dev proxy with envoy/envoy.yaml, edited by the
// replacements (old, new pairs), the real filter with perIPPolicy, and an
// upstream that echoes the x-forwarded-for it received. listen is the
// proxy's address ("127.0.0.1:0" or "[::1]:0").
func proxyFor(t *testing.T, listen string, edits ...string) (url string, log *syncWriter, p *Proxy) {
	t.Helper()
	doc, err := os.ReadFile("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(edits); i += 2 {
		if !bytes.Contains(doc, []byte(edits[i])) {
			t.Fatalf("%q not in envoy.yaml", edits[i])
		}
		doc = bytes.Replace(doc, []byte(edits[i]), []byte(edits[i+1]), 1)
	}
	c, err := ParseEnvoyConfig(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := *c.Filter
	f.PluginConfig = []byte(perIPPolicy)
	c.Filter = &f
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Xff", strings.Join(r.Header.Values("X-Forwarded-For"), "|"))
	}))
	t.Cleanup(up.Close)
	log = &syncWriter{}
	p, err = New(context.Background(), Options{Config: c, Wasm: filterWasm(t), Workers: 1,
		Upstream: up.Listener.Addr().String(), AccessLog: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", listen, err)
	}
	srv := httptest.NewUnstartedServer(p)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, log, p
}

// behindOneBalancer is the shipped file with the load balancer in front
// that its comment describes: the balancer appends its peer to
// x-forwarded-for and Envoy trusts one hop.
var behindOneBalancer = []string{"use_remote_address: true", "use_remote_address: true\n          xff_num_trusted_hops: 1"}

// get sends one request with the given x-forwarded-for values and returns
// the status, the x-forwarded-for the upstream saw and the access-log
// line's client_ip and rate_limit's key.
func get(t *testing.T, url string, log *syncWriter, xff ...string) (status int, seenXFF, clientIP, key string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/", nil)
	for _, v := range xff {
		req.Header.Add("X-Forwarded-For", v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	log.mu.Lock()
	line := log.lines[len(log.lines)-1]
	log.mu.Unlock()
	var e map[string]any
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		t.Fatal(err)
	}
	clientIP, _ = e["client_ip"].(string)
	f, err := filterstate.FromLogLine(e)
	if err != nil {
		t.Fatalf("rate_limit %v: %v", e[filterstate.LogField], err)
	}
	key = f["key"]
	return resp.StatusCode, resp.Header.Get("X-Seen-Xff"), clientIP, key
}

// TestClientsBehindABalancerEachGetTheirOwnKey: three clients behind one
// load balancer (the test's HTTP client on loopback, writing each client's
// address to x-forwarded-for as a balancer does), Envoy with
// use_remote_address and xff_num_trusted_hops 1: each client is its own key
// with its own limit (200 200 200, not 200 429 429), the access log shows
// the client, and a second request of the first client is limited.
func TestClientsBehindABalancerEachGetTheirOwnKey(t *testing.T) {
	url, log, p := proxyFor(t, "127.0.0.1:0", behindOneBalancer...)
	for _, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		status, seen, ip, key := get(t, url, log, client)
		if status != 200 || ip != client || key != "rl:dev:p/ip:ip="+client+":3600s" {
			t.Errorf("client %s: %d, client_ip %q, key %q", client, status, ip, key)
		}
		// Envoy appends its loopback peer as its own local address.
		if want := client + "," + p.localAddr.String(); seen != want {
			t.Errorf("client %s: upstream saw x-forwarded-for %q, want %q", client, seen, want)
		}
	}
	if status, _, _, _ := get(t, url, log, "198.51.100.1"); status != 429 {
		t.Errorf("client 198.51.100.1 again: %d, want 429", status)
	}
}

// TestForgedXFFCannotChooseTheKey: a client that writes x-forwarded-for at
// every position cannot choose its key, neither behind a balancer (which
// appends the client's real address) nor at an edge Envoy (the shipped
// file: the client is the TCP peer). After its one request every further
// one is limited, whatever it forges.
func TestForgedXFFCannotChooseTheKey(t *testing.T) {
	forgeries := [][]string{
		{"192.0.2.1"},
		{"192.0.2.1, 192.0.2.2"},
		{"192.0.2.1", "192.0.2.2", "192.0.2.3"},
		{"192.0.2.4,192.0.2.5,192.0.2.6,192.0.2.7,192.0.2.8"},
		{"2001:db8::66"},
		{"not-an-ip"},
		{""},
	}
	t.Run("behind a balancer", func(t *testing.T) {
		url, log, _ := proxyFor(t, "127.0.0.1:0", behindOneBalancer...)
		const real = "198.51.100.9"
		if status, _, _, key := get(t, url, log, real); status != 200 || !strings.Contains(key, "ip="+real+":") {
			t.Fatalf("first request: %d, key %q", status, key)
		}
		for _, f := range forgeries {
			// The balancer appends the address it saw after what the
			// client sent.
			xff := append(append([]string(nil), f...), real)
			status, _, ip, key := get(t, url, log, xff...)
			if status != 429 || ip != real || !strings.Contains(key, "ip="+real+":") {
				t.Errorf("forged %q: %d, client_ip %q, key %q; want 429 for %s", f, status, ip, key, real)
			}
		}
	})
	t.Run("edge", func(t *testing.T) {
		url, log, _ := proxyFor(t, "127.0.0.1:0")
		if status, _, _, _ := get(t, url, log); status != 200 {
			t.Fatalf("first request: %d", status)
		}
		for _, f := range forgeries {
			status, _, ip, key := get(t, url, log, f...)
			if status != 429 || ip != "127.0.0.1" || !strings.Contains(key, "ip=127.0.0.1:") {
				t.Errorf("forged %q: %d, client_ip %q, key %q; want 429 for 127.0.0.1", f, status, ip, key)
			}
		}
	})
}

// TestClientAddressIPv6AndPorts: behind a balancer, an IPv6 client is its
// own key; an x-forwarded-for entry with a port or brackets is not an
// address to Envoy, which then falls back to the peer. An IPv6 peer at the
// edge is keyed on its address.
func TestClientAddressIPv6AndPorts(t *testing.T) {
	url, log, _ := proxyFor(t, "127.0.0.1:0", behindOneBalancer...)
	for _, tc := range []struct{ xff, ip, key string }{
		{"2001:db8::1", "2001:db8::1", "2001%3Adb8%3A%3A1"},
		{"2001:db8::1", "2001:db8::1", ""}, // the same client again: limited
		{"198.51.100.7:8080", "127.0.0.1", "127.0.0.1"},
		{"[2001:db8::2]:443", "127.0.0.1", ""}, // the peer again: limited
		{" 198.51.100.8 ", "198.51.100.8", "198.51.100.8"},
	} {
		status, _, ip, key := get(t, url, log, tc.xff)
		want := 200
		if tc.key == "" {
			want = 429
		} else if key != "rl:dev:p/ip:ip="+tc.key+":3600s" {
			t.Errorf("xff %q: key %q, want ip=%s", tc.xff, key, tc.key)
		}
		if status != want || ip != tc.ip {
			t.Errorf("xff %q: %d, client_ip %q; want %d, %s", tc.xff, status, ip, want, tc.ip)
		}
	}
	t.Run("ipv6 peer", func(t *testing.T) {
		url, log, p := proxyFor(t, "[::1]:0")
		status, seen, ip, key := get(t, url, log, "192.0.2.1")
		if status != 200 || ip != "::1" || key != "rl:dev:p/ip:ip=%3A%3A1:3600s" {
			t.Errorf("%d, client_ip %q, key %q", status, ip, key)
		}
		if want := "192.0.2.1," + p.localAddr.String(); seen != want {
			t.Errorf("upstream saw x-forwarded-for %q, want %q", seen, want)
		}
	})
}

// TestTrustedClientAddress pins trustedClient to Envoy's rules, with the
// examples of Envoy's headers doc ("x-forwarded-for") and the loopback
// and skip_xff_append cases of conn_manager_utility.cc.
func TestTrustedClientAddress(t *testing.T) {
	local := netip.MustParseAddr("10.9.9.9")
	for _, tc := range []struct {
		name       string
		useRemote  bool
		hops       uint32
		skip       bool
		peer       string
		xff        string // "-": none
		wantRemote string
		wantXFF    string // "-": none
	}{
		{"doc example 1: edge, no trusted hops", true, 0, false, "192.0.2.5:1234", "203.0.113.128, 203.0.113.10, 203.0.113.1",
			"192.0.2.5:1234", "203.0.113.128, 203.0.113.10, 203.0.113.1,192.0.2.5"},
		{"doc example 2: internal, rightmost", false, 0, false, "10.11.12.13:1", "203.0.113.128, 203.0.113.10, 203.0.113.1, 192.0.2.5",
			"192.0.2.5:0", "203.0.113.128, 203.0.113.10, 203.0.113.1, 192.0.2.5"},
		{"doc example 3: edge, two trusted hops", true, 2, false, "192.0.2.5:1", "203.0.113.128, 203.0.113.10, 203.0.113.1",
			"203.0.113.10:0", "203.0.113.128, 203.0.113.10, 203.0.113.1,192.0.2.5"},
		{"doc example 4: internal, two trusted hops", false, 2, false, "10.11.12.13:1", "203.0.113.128, 203.0.113.10, 203.0.113.1, 192.0.2.5",
			"203.0.113.10:0", "203.0.113.128, 203.0.113.10, 203.0.113.1, 192.0.2.5"},
		{"doc example 5: internal, no xff", false, 0, false, "10.20.30.40:1", "-", "10.20.30.40:1", "-"},
		{"one balancer", true, 1, false, "10.0.0.9:5", "198.51.100.1", "198.51.100.1:0", "198.51.100.1,10.0.0.9"},
		{"too few entries: peer", true, 2, false, "10.0.0.9:5", "198.51.100.1", "10.0.0.9:5", "198.51.100.1,10.0.0.9"},
		{"no xff with trusted hops: peer", true, 1, false, "10.0.0.9:5", "-", "10.0.0.9:5", "10.0.0.9"},
		{"entry with a port is no address", true, 1, false, "10.0.0.9:5", "198.51.100.1:80", "10.0.0.9:5", "198.51.100.1:80,10.0.0.9"},
		{"bracketed ipv6 is no address", true, 1, false, "10.0.0.9:5", "[2001:db8::1]", "10.0.0.9:5", "[2001:db8::1],10.0.0.9"},
		{"ipv6 entry", true, 1, false, "10.0.0.9:5", "2001:db8::1", "[2001:db8::1]:0", "2001:db8::1,10.0.0.9"},
		{"trailing comma is no address", false, 0, false, "10.0.0.9:5", "198.51.100.1,", "10.0.0.9:5", "198.51.100.1,"},
		{"loopback peer appends the local address", true, 0, false, "127.0.0.1:5", "-", "127.0.0.1:5", "10.9.9.9"},
		{"ipv6 loopback peer too", true, 0, false, "[::1]:5", "-", "[::1]:5", "10.9.9.9"},
		{"127.0.0.2 is not loopback to Envoy", true, 0, false, "127.0.0.2:5", "-", "127.0.0.2:5", "127.0.0.2"},
		{"skip_xff_append", true, 1, true, "10.0.0.9:5", "198.51.100.1", "198.51.100.1:0", "198.51.100.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &EnvoyConfig{UseRemoteAddress: tc.useRemote, XffNumTrustedHops: tc.hops, SkipXffAppend: tc.skip}
			xff, has := tc.xff, tc.xff != "-"
			if !has {
				xff = ""
			}
			remote, out, outHas := c.trustedClient(netip.MustParseAddrPort(tc.peer), xff, has, local)
			if !outHas {
				out = "-"
			}
			if remote.String() != tc.wantRemote || out != tc.wantXFF {
				t.Errorf("got %s, xff %q; want %s, %q", remote, out, tc.wantRemote, tc.wantXFF)
			}
		})
	}
}

// TestOriginalIPDetectionRefused: the dev proxy does not run
// original_ip_detection_extensions, so it refuses a file with them rather
// than key clients on another address than Envoy would.
func TestOriginalIPDetectionRefused(t *testing.T) {
	doc, err := os.ReadFile("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc = bytes.Replace(doc, []byte("use_remote_address: true"), []byte(`original_ip_detection_extensions:
          - name: envoy.http.original_ip_detection.custom_header
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.http.original_ip_detection.custom_header.v3.CustomHeaderConfig
              header_name: x-real-ip`), 1)
	if _, err := ParseEnvoyConfig(doc); err == nil || !strings.Contains(err.Error(), "original_ip_detection_extensions") {
		t.Fatalf("accepted, or another error: %v", err)
	}
}
