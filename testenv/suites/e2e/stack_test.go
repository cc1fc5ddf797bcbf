package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/filterstate"
	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// workers is the number of worker VMs the dev proxy runs.
const workers = 2

const (
	adminToken = "e2e-admin-token"
	readToken  = "e2e-read-token"
)

// stack is the control plane, the demo upstream and the dev proxy as
// processes, started as `make run` starts them.
type stack struct {
	t                   *testing.T
	cp, echo, dp        *proctest.Proc
	cpAddr, proxyAddr   string
	accessLog           string
	redisAddr, redisDir string
	redis               *redisproc.Server
}

// startStack starts the processes; withRedis selects a redis-server store
// (else the embedded one).
func startStack(t *testing.T, withRedis bool) *stack {
	t.Helper()
	s := &stack{t: t, cpAddr: proctest.FreeAddr(t), proxyAddr: proctest.FreeAddr(t)}
	dir := t.TempDir()
	s.accessLog = filepath.Join(dir, "access.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.accessLog)
			t.Logf("access log:\n%s", b)
		}
	})
	cpArgs := []string{"--listen", s.cpAddr, "--log-level", "warn", "--resync-interval", "200ms"}
	if withRedis {
		s.redisAddr, s.redisDir = proctest.FreeAddr(t), t.TempDir()
		s.redis = startRedis(t, s.redisAddr, s.redisDir)
		cpArgs = append(cpArgs, "--redis-url", "redis://"+s.redisAddr)
	} else {
		cpArgs = append(cpArgs, "--data-dir", filepath.Join(dir, "data"))
	}
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_READ_TOKEN=" + readToken, "SLUICE_QUOTA_TOKEN=" + quotaToken}
	s.cp = startProc(t, "control plane", filepath.Join(binDir, "sluice-controlplane"), cpArgs, tokens)
	proctest.AwaitHTTP(t, "http://"+s.cpAddr+"/readyz", readyTimeout, s.cp)
	up := proctest.FreeAddr(t)
	s.echo = startProc(t, "upstream", filepath.Join(binDir, "sluice-echo"), []string{"--listen", up}, nil)
	s.dp = startProc(t, "dev proxy", filepath.Join(binDir, "sluice-devproxy"), []string{
		"--config", "envoy/envoy.yaml", "--wasm", filepath.Join(binDir, "sluice.wasm"), "--listen", s.proxyAddr,
		"--upstream", up, "--cluster", "control_plane=" + s.cpAddr, "--access-log", s.accessLog, "--workers", strconv.Itoa(workers),
		"--log-level", "warn"}, append(tokens, "SLUICE_ENV=e2e"))
	proctest.AwaitHTTP(t, "http://"+up+"/", readyTimeout, s.echo)
	proctest.AwaitListening(t, s.proxyAddr, listenTimeout, s.dp)
	return s
}

// put sends a write to the control plane and returns the status and body.
func (s *stack) put(path, doc string) (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+s.cpAddr+path, strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// putOK is put that must succeed; it returns the new policy version.
func (s *stack) putOK(path, doc string) uint64 {
	s.t.Helper()
	code, b := s.put(path, doc)
	if code != http.StatusOK && code != http.StatusCreated {
		s.t.Fatalf("PUT %s: %d %s", path, code, b)
	}
	var v struct{ Version uint64 }
	if err := json.Unmarshal(b, &v); err != nil {
		s.t.Fatalf("PUT %s: %v in %s", path, err, b)
	}
	return v.Version
}

func (s *stack) applyDemo() uint64 {
	s.t.Helper()
	doc, err := os.ReadFile(filepath.Join(repo, "examples/default-policy.json"))
	if err != nil {
		s.t.Fatal(err)
	}
	return s.putOK("/v1/policies/default", string(doc))
}

// response is what a client got.
type response struct {
	status int
	header http.Header
	body   []byte
}

// get sends GET path through the dev proxy with the headers given as
// name, value pairs.
func (s *stack) get(method, path string, kv ...string) response {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.proxyAddr+path, nil)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// logLines returns the access log's lines, parsed.
func (s *stack) logLines() []map[string]any {
	s.t.Helper()
	b, err := os.ReadFile(s.accessLog)
	if err != nil && !os.IsNotExist(err) {
		s.t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			s.t.Fatalf("access log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// logOf returns the access-log line of the request with x-request-id id.
func (s *stack) logOf(id string) map[string]any {
	s.t.Helper()
	var found map[string]any
	proctest.WaitFor(5*time.Second, func() bool {
		for _, m := range s.logLines() {
			if m["request_id"] == id {
				found = m
				return true
			}
		}
		return false
	})
	if found == nil {
		s.t.Fatalf("no access-log line with request_id %s", id)
	}
	return found
}

// rateLimit returns the fields of an access-log line's rate_limit (the
// filter's decision; filterstate.FromLogLine), empty when the line has
// none, and one "error" entry when it cannot be read.
func rateLimit(m map[string]any) map[string]string {
	f, err := filterstate.FromLogLine(m)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	return f
}

// probePath is matched by the demo's reports-per-tenant-day rule, which
// does not count a request without x-tenant-id: the filter decides it
// under the policy in use and logs the version without charging anything.
const probePath = "/reports/e2e-probe"

// awaitVersion sends probes (probePath) until the
// filter reports policy version v on every worker; it returns how long that
// took. The dev proxy spreads requests round robin, and a worker may trail
// a publication by up to policysync.RequestCheckInterval (or a tick), so
// one probe under v proves only its own worker: it takes 2×workers
// consecutive probes under v.
func (s *stack) awaitVersion(v uint64) time.Duration {
	s.t.Helper()
	start := time.Now()
	want := strconv.FormatUint(v, 10)
	n, run := 0, 0
	ok := proctest.WaitFor(30*time.Second, func() bool {
		for {
			n++
			id := fmt.Sprintf("probe-%d-%d", v, n)
			s.get("GET", probePath, "X-Request-Id", id)
			if rateLimit(s.logOf(id))["policy_version"] != want {
				run = 0
				return false
			}
			if run++; run >= 2*workers {
				return true
			}
		}
	})
	if !ok {
		s.t.Fatalf("the filter did not use policy version %d on every worker within 30s\n%s", v, s.dp.Output())
	}
	return time.Since(start)
}
