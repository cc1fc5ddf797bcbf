// Command sluice-run is `make run`: it starts the control plane, applies the
// demo policy as "default" unless a policy "default" is already stored (a
// previous run's, possibly changed by the user, is kept), starts the demo upstream and two proxies (the real Envoy when
// there is one, else the dev proxy), waits until the
// filter enforces the policy, prints what to try, and on SIGINT (Ctrl-C) or
// SIGTERM stops every process it started (each in its own process group,
// SIGTERM then SIGKILL after 5s), leaving none behind.
//
// Settings come from the environment (the Makefile passes its variables);
// sluice-run -h lists them (usage).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	for _, a := range os.Args[1:] {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			fmt.Print(usage)
			os.Exit(0)
		}
	}
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "sluice-run: no arguments are taken (got %q); settings come from the environment:\n\n%s", os.Args[1:], usage)
		os.Exit(2)
	}
	os.Exit(run())
}

// usage is what -h prints: what the command does and the variables it reads.
const usage = `sluice-run (make run) starts the control plane, applies the demo policy as "default"
unless one is stored, starts the demo upstream and two proxies (the real Envoy when there
is one, else the dev proxy), waits until the filter enforces the policy, prints what to
try, and stops everything it started on Ctrl-C. It takes no arguments; settings come from
the environment (make passes its variables):

  CP_PORT        control plane port (8080)
  PROXY_PORT     first proxy port (10000)
  PROXY2_PORT    second proxy port (10001), on the same control plane
  ADMIN_PORT, ADMIN2_PORT  the proxies' admin ports (9901, 9902)
  GRPC_PORT      the control plane's gRPC port: the RateLimitService and RLQS (8081)
  RLS_PORT, RLS_ADMIN_PORT  the Envoy whose ratelimit filter asks the RateLimitService,
                 with the real Envoy only (10002, 9903)
  RLS_POLICY     the policy applied as "edge" when there is none (examples/rls-policy.json)
  UPSTREAM_PORT  demo upstream port (8000)
  REDIS_URL      use Redis (redis://host:port); empty: the embedded store in RUN_DIR/data
  SLUICE_ADMIN_TOKEN, SLUICE_READ_TOKEN  the tokens (default: RUN_DIR/tokens, or generated)
  SLUICE_QUOTA_TOKEN  the quota token the proxies lease fleet quota with
  BIN_DIR        where the binaries and sluice.wasm are (build)
  RUN_DIR        data, logs, access logs, tokens (build/run)
  POLICY         the policy applied as "default" when there is none (examples/default-policy.json)
  ENVOY_CONFIG   the Envoy bootstrap the proxies follow (envoy/envoy.yaml)
  WORKERS        worker threads of each proxy (2)
  ENVOY          the Envoy binary (default BIN_DIR/envoy, which make envoy installs)
  PROXY          devproxy: the dev proxy even when Envoy is installed
`

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type settings struct {
	cpPort, proxyPort, upPort     string
	proxy2Port, quota             string
	adminPort, admin2Port         string
	grpcPort, rlsPort             string // the RateLimitService and its Envoy
	rlsAdminPort, rlsPolicy       string
	redisURL, admin, read         string
	binDir, runDir, policy, envoy string
	workers                       string
	tokens                        tokenSource
	tokenFile                     string
	proxy                         proxyRunner // the real Envoy or the dev proxy
}

// tokenSource says where the tokens of a run came from.
type tokenSource int

const (
	tokensFromEnv   tokenSource = iota // SLUICE_ADMIN_TOKEN and SLUICE_READ_TOKEN
	tokensKept                         // RUN_DIR/tokens, from an earlier run
	tokensGenerated                    // generated now, saved in RUN_DIR/tokens
)

// loadTokens fills the tokens the environment leaves empty: from RUN_DIR/tokens
// (written by an earlier run, mode 0600), else generated and saved there, so the
// exports a second terminal holds stay valid across runs.
func (s *settings) loadTokens() error {
	s.tokenFile = filepath.Join(s.runDir, "tokens")
	saved := map[string]string{}
	if b, err := os.ReadFile(s.tokenFile); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && v != "" {
				saved[k] = v
			}
		}
	}
	fromEnv := s.admin != "" && s.read != ""
	kept := true
	for _, t := range []struct {
		v   *string
		key string
	}{{&s.admin, "SLUICE_ADMIN_TOKEN"}, {&s.read, "SLUICE_READ_TOKEN"}, {&s.quota, "SLUICE_QUOTA_TOKEN"}} {
		if *t.v != "" {
			continue
		}
		if *t.v = saved[t.key]; *t.v == "" {
			*t.v, kept = token(), false
		}
	}
	switch {
	case fromEnv:
		s.tokens = tokensFromEnv
	case kept:
		s.tokens = tokensKept
	default:
		s.tokens = tokensGenerated
	}
	if err := os.MkdirAll(s.runDir, 0o755); err != nil {
		return err
	}
	doc := "SLUICE_ADMIN_TOKEN=" + s.admin + "\nSLUICE_READ_TOKEN=" + s.read + "\nSLUICE_QUOTA_TOKEN=" + s.quota + "\n"
	if err := os.WriteFile(s.tokenFile, []byte(doc), 0o600); err != nil {
		return fmt.Errorf("saving the tokens: %w", err)
	}
	return os.Chmod(s.tokenFile, 0o600) // an older file keeps its mode on rewrite
}

func run() int {
	s := settings{
		cpPort: env("CP_PORT", "8080"), proxyPort: env("PROXY_PORT", "10000"), upPort: env("UPSTREAM_PORT", "8000"),
		redisURL: os.Getenv("REDIS_URL"), admin: os.Getenv("SLUICE_ADMIN_TOKEN"), read: os.Getenv("SLUICE_READ_TOKEN"),
		binDir: env("BIN_DIR", "build"), runDir: env("RUN_DIR", "build/run"),
		policy: env("POLICY", "examples/default-policy.json"), envoy: env("ENVOY_CONFIG", "envoy/envoy.yaml"),
		workers: env("WORKERS", "2"), proxy2Port: env("PROXY2_PORT", "10001"), quota: os.Getenv("SLUICE_QUOTA_TOKEN"),
		adminPort: env("ADMIN_PORT", "9901"), admin2Port: env("ADMIN2_PORT", "9902"),
		grpcPort: env("GRPC_PORT", "8081"), rlsPort: env("RLS_PORT", "10002"), rlsAdminPort: env("RLS_ADMIN_PORT", "9903"),
		rlsPolicy: env("RLS_POLICY", "examples/rls-policy.json"),
	}
	s.proxy = chooseProxy(s.binDir)
	release, err := lockRunDir(s.runDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-run: %v\n", err)
		return 1
	}
	defer release()
	if err := s.loadTokens(); err != nil {
		fmt.Fprintf(os.Stderr, "sluice-run: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sup := &supervisor{exited: make(chan string, 8)}
	defer sup.stopAll()
	if err := start(ctx, s, sup); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "sluice-run: interrupted; stopping")
			return 0
		}
		fmt.Fprintf(os.Stderr, "sluice-run: %v\n", err)
		return 1
	}
	done := make(chan struct{})
	defer close(done)
	go newDecisions(filepath.Join(s.runDir, "access.log"), filepath.Join(s.runDir, "access2.log")).report(5*time.Second, done)
	select {
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "\nsluice-run: stopping (Ctrl-C)")
		return 0
	case name := <-sup.exited:
		fmt.Fprintf(os.Stderr, "sluice-run: %s exited unexpectedly; see %s; stopping\n", name, filepath.Join(s.runDir, name+".log"))
		return 1
	}
}

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func start(ctx context.Context, s settings, sup *supervisor) error {
	if err := checkPorts(s); err != nil {
		return err
	}
	if err := os.MkdirAll(s.runDir, 0o755); err != nil {
		return err
	}
	policy, err := os.ReadFile(s.policy)
	if err != nil {
		return fmt.Errorf("the demo policy: %w", err)
	}
	cp := "127.0.0.1:" + s.cpPort
	store := "embedded store in " + filepath.Join(s.runDir, "data")
	grpc := "127.0.0.1:" + s.grpcPort
	cpArgs := []string{"--listen", cp, "--grpc-listen", grpc, "--log-format", "text"}
	if s.redisURL != "" {
		cpArgs = append(cpArgs, "--redis-url", s.redisURL)
		store = "Redis at " + s.redisURL
	} else {
		cpArgs = append(cpArgs, "--data-dir", filepath.Join(s.runDir, "data"))
	}
	tokens := []string{"SLUICE_ADMIN_TOKEN=" + s.admin, "SLUICE_READ_TOKEN=" + s.read, "SLUICE_QUOTA_TOKEN=" + s.quota}

	step("starting the control plane on http://%s (%s)", cp, store)
	if err := sup.start(s, "controlplane", filepath.Join(s.binDir, "sluice-controlplane"), cpArgs, tokens); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+cp+"/readyz", 20*time.Second, sup); err != nil {
		return fmt.Errorf("control plane not ready: %w (see %s/controlplane.log)", err, s.runDir)
	}
	version, created, err := applyDemo(ctx, cp, s.admin, "default", policy)
	if err != nil {
		return err
	}
	if created {
		step("applied %s as policy \"default\" (version %d)", s.policy, version)
	} else {
		step("keeping the stored policy \"default\" (version %d); %s is applied only when there is none (delete the policy to get it back)", version, s.policy)
	}
	up := "127.0.0.1:" + s.upPort
	step("starting the demo upstream on http://%s", up)
	if err := sup.start(s, "upstream", filepath.Join(s.binDir, "sluice-echo"), []string{"--listen", up}, nil); err != nil {
		return err
	}
	proxy, proxy2 := "127.0.0.1:"+s.proxyPort, "127.0.0.1:"+s.proxy2Port
	accessLog, accessLog2 := filepath.Join(s.runDir, "access.log"), filepath.Join(s.runDir, "access2.log")
	r := s.proxy
	step("proxies: %s", r.describe())
	for _, p := range []proxySpec{
		{n: 1, listen: proxy, admin: "127.0.0.1:" + s.adminPort, accessLog: accessLog, node: "sluice-dev"},
		{n: 2, listen: proxy2, admin: "127.0.0.1:" + s.admin2Port, accessLog: accessLog2, node: "sluice-dev-2"},
	} {
		p.up, p.cp, p.config, p.binDir, p.runDir, p.workers = up, cp, s.envoy, s.binDir, s.runDir, s.workers
		if p.n == 1 {
			step("starting %s on http://%s (%s, %s workers)", r.the(), proxy, s.envoy, s.workers)
		} else {
			step("starting a second %s on http://%s (same control plane: fleet rules hold across both)", r.name(), proxy2)
		}
		bin, args, err := r.command(p)
		if err != nil {
			return err
		}
		if err := sup.start(s, r.logName(p.n), bin, args, append(tokens, "SLUICE_ENV=dev")); err != nil {
			return err
		}
	}
	if err := waitHTTP(ctx, "http://"+up+"/", 20*time.Second, sup); err != nil {
		return fmt.Errorf("demo upstream not ready: %w", err)
	}
	if r.envoyBin != "" {
		if err := startRLSEnvoy(ctx, s, sup, cp, grpc, up, tokens); err != nil {
			return err
		}
	}
	step("waiting for the filter to pull policy version %d or later", version)
	workers, err := strconv.Atoi(s.workers)
	if err != nil || workers < 1 {
		return fmt.Errorf("WORKERS=%q: want a positive number", s.workers)
	}
	for n, addr := range []string{proxy, proxy2} {
		logFile := filepath.Join(s.runDir, r.logName(n+1)+".log")
		if err := waitPolicy(ctx, r, addr, logFile, version, workers, 60*time.Second, sup); err != nil {
			var ex *exitError
			if errors.As(err, &ex) {
				// Another process may be the one that exited: its own log says why.
				logFile = filepath.Join(s.runDir, ex.name+".log")
			}
			return fmt.Errorf("the %s on %s does not enforce the policy: %w (see %s)", r.name(), addr, err, logFile)
		}
	}
	printTry(s, cp, proxy, up, accessLog, store, created)
	return nil
}

func step(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "==> "+format+"\n", args...)
}

// applyDemo creates policy name from doc unless it exists: a PUT with
// If-None-Match: * (create only). It returns the version created, or on
// 412 (the policy exists) the stored version, read back with a GET; created
// says which.
func applyDemo(ctx context.Context, cp, admin, name string, doc []byte) (version uint64, created bool, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+cp+"/v1/policies/"+name, bytes.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-None-Match", "*")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("applying the policy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		v, err := versionOf(body)
		if err != nil {
			return 0, false, fmt.Errorf("applying the policy: %w", err)
		}
		return v, true, nil
	case http.StatusPreconditionFailed:
		v, err := storedVersion(ctx, cp, admin, name)
		if err != nil {
			return 0, false, fmt.Errorf("reading the stored policy: %w", err)
		}
		return v, false, nil
	default:
		return 0, false, fmt.Errorf("applying the policy: %s: %s", resp.Status, body)
	}
}

// storedVersion returns the version of policy name.
func storedVersion(ctx context.Context, cp, token, name string) (uint64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cp+"/v1/policies/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", resp.Status, body)
	}
	return versionOf(body)
}

// versionOf reads the "version" member of a policy document.
func versionOf(body []byte) (uint64, error) {
	var v struct {
		Version uint64 `json:"version"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Version == 0 {
		return 0, fmt.Errorf("no version in %s", body)
	}
	return v.Version, nil
}

// waitHTTP polls url until it answers 200, the deadline passes or a child
// exits.
func waitHTTP(ctx context.Context, url string, limit time.Duration, sup *supervisor) error {
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %v after %s", url, err, limit)
		}
		if err := sup.pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitPolicy probes the dev proxy until policy version, or a later one,
// is in use on every worker: someone may change the policy while make run
// starts (a script that starts it and applies its own), and the filter
// then pulls the newer version only. A worker takes up a version on a
// request or a tick and logs "policy <name> version <n> in use"; the
// probes drive the workers, and the dev proxy's own log (procLog, where it
// writes the guest's lines with a worker attribute) tells when every
// worker 0..workers-1 has logged version or later. The access log cannot
// tell: the filter writes no filter state for a request no rule matches.
func waitPolicy(ctx context.Context, r proxyRunner, proxy, procLog string, version uint64, workers int, limit time.Duration, sup *supervisor) error {
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxy+"/sluice-run/ready", nil)
		req.Header.Set("User-Agent", "sluice-run readiness probe")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		if b, err := os.ReadFile(procLog); err == nil && r.workersAt(b, "default", version, workers) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("policy version %d (or later) not in use after %s", version, limit)
		}
		if err := sup.pause(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// versionLine matches the filter's "policy <name> version <n> in use" line
// as the dev proxy's text log writes it (msg="…" … worker=<i>).
var versionLine = regexp.MustCompile(`msg="sluice: policy (\S+) version (\d+) in use[^"]*".* worker=(-?\d+)`)

// allWorkersAt reports whether the last version line of policy logged by
// each worker 0..workers-1 in log is version or later.
func allWorkersAt(log []byte, policy string, version uint64, workers int) bool {
	last := make(map[int]uint64)
	for _, m := range versionLine.FindAllSubmatch(log, -1) {
		if string(m[1]) != policy {
			continue
		}
		v, err1 := strconv.ParseUint(string(m[2]), 10, 64)
		w, err2 := strconv.Atoi(string(m[3]))
		if err1 == nil && err2 == nil {
			last[w] = v
		}
	}
	for w := range workers {
		if last[w] < version {
			return false
		}
	}
	return true
}

func printTry(s settings, cp, proxy, up, accessLog, store string, demo bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nsluice is running.\n")
	fmt.Fprintf(&b, "  proxy          http://%s  (%s: %s, %s/sluice.wasm, %s workers)\n", proxy, s.proxy.name(), s.envoy, s.binDir, s.workers)
	fmt.Fprintf(&b, "  proxy 2        http://127.0.0.1:%s  (the same; fleet rules hold across both)\n", s.proxy2Port)
	fmt.Fprintf(&b, "  control plane  http://%s  (%s)\n", cp, store)
	fmt.Fprintf(&b, "  demo upstream  http://%s  (echoes the request as JSON; ?delay=<ms>)\n", up)
	fmt.Fprintf(&b, "  access logs    %s (proxy), %s (proxy 2)\n", accessLog, filepath.Join(s.runDir, "access2.log"))
	fmt.Fprintf(&b, "  process logs   %s/{controlplane,%s,%s,upstream}.log\n", s.runDir, s.proxy.logName(1), s.proxy.logName(2))
	fmt.Fprintf(&b, "  metrics        http://%s/metrics (control plane), http://127.0.0.1:%s/stats/prometheus and :%s (the proxies' admin;\n", cp, s.adminPort, s.admin2Port)
	fmt.Fprintf(&b, "                 what envoy/monitoring's dashboard and alerts read)\n")
	if s.proxy.envoyBin != "" {
		fmt.Fprintf(&b, "  ratelimit      http://127.0.0.1:%s  (Envoy's own ratelimit filter asking the control plane's RateLimitService on\n", s.rlsPort)
		fmt.Fprintf(&b, "                 127.0.0.1:%s, policy \"edge\"; its log %s/envoy-rls.log; docs/rls.md, \"Try it with make run\")\n", s.grpcPort, s.runDir)
	}
	b.WriteString("\n")
	switch s.tokens {
	case tokensGenerated:
		fmt.Fprintf(&b, "Tokens (generated, kept in %s for the next runs). In another terminal:\n", s.tokenFile)
	case tokensKept:
		fmt.Fprintf(&b, "Tokens (kept from an earlier run in %s). In another terminal:\n", s.tokenFile)
	default:
		fmt.Fprintf(&b, "Tokens (from the environment). In another terminal:\n")
	}
	fmt.Fprintf(&b, "  export SLUICE_ADMIN_TOKEN=%s\n  export SLUICE_READ_TOKEN=%s\n", s.admin, s.read)
	if s.cpPort != "8080" {
		fmt.Fprintf(&b, "  export SLUICE_SERVER=http://%s\n", cp)
	}
	b.WriteString("\n")
	if !demo {
		fmt.Fprintf(&b, "The policy \"default\" is the stored one, not the demo; the steps below assume the demo (%s).\n", s.policy)
	}
	steps, err := walkthrough(readme)
	if err != nil {
		fmt.Fprintf(&b, "Then follow README.md, \"Five-minute walkthrough\" (%v).\n", err)
	} else {
		ports := strings.NewReplacer("127.0.0.1:10000", proxy, "127.0.0.1:10001", "127.0.0.1:"+s.proxy2Port, "127.0.0.1:8080", cp,
			"build/run/", s.runDir+"/", "for p in 10000 10001", "for p in "+s.proxyPort+" "+s.proxy2Port)
		fmt.Fprintf(&b, "Then try README.md's \"Five-minute walkthrough\", step by step:\n")
		for _, st := range steps {
			fmt.Fprintf(&b, "%s\n", st.title)
			for _, c := range st.commands {
				fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(ports.Replace(c), "\n", "\n  "))
			}
		}
	}
	fmt.Fprintf(&b, "Every 5 s with traffic, a line shows each rule's allowed and limited requests. Stop with Ctrl-C.\n")
	fmt.Print(b.String())
}

// readme is where the walkthrough is read from: make run runs in the repository root.
const readme = "README.md"

// walkStep is one numbered step of the README's walkthrough.
type walkStep struct {
	title    string   // "1. Trip a limit"
	commands []string // its ```sh blocks, in order
}

var (
	stepTitle = regexp.MustCompile(`(?m)^\*\*(\d+\. [^*]+?)[.:]?\*\*`)
	shBlock   = regexp.MustCompile("(?s)```sh\n(.*?)```")
)

// walkthrough reads the steps of the README's walkthrough (between its
// walkthrough markers: each "**N. Title.**" paragraph and the ```sh blocks after
// it), so that make run prints exactly what the README says, from one source.
func walkthrough(path string) ([]walkStep, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc := string(b)
	i, j := strings.Index(doc, "<!-- walkthrough:begin -->"), strings.Index(doc, "<!-- walkthrough:end -->")
	if i < 0 || j < i {
		return nil, errors.New(path + ": no walkthrough markers")
	}
	doc = doc[i:j]
	titles := stepTitle.FindAllStringSubmatchIndex(doc, -1)
	if len(titles) == 0 {
		return nil, errors.New(path + ": no numbered steps in the walkthrough")
	}
	var steps []walkStep
	for k, m := range titles {
		end := len(doc)
		if k+1 < len(titles) {
			end = titles[k+1][0]
		}
		st := walkStep{title: doc[m[2]:m[3]]}
		for _, c := range shBlock.FindAllStringSubmatch(doc[m[1]:end], -1) {
			st.commands = append(st.commands, strings.TrimSpace(c[1]))
		}
		steps = append(steps, st)
	}
	return steps, nil
}
