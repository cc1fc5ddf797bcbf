package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/sluice-proxy/sluice/testenv/internal/bootstrap"
)

// proxyRunner says which proxy make run starts, and how: the real Envoy when
// there is one (ENVOY, else BIN_DIR/envoy from make envoy), else the dev proxy.
// PROXY=devproxy chooses the dev proxy whatever is installed.
type proxyRunner struct {
	envoyBin string // "" for the dev proxy
	version  string // Envoy's version, e.g. "1.40.0"
}

// chooseProxy finds the proxy make run starts.
func chooseProxy(binDir string) proxyRunner {
	if os.Getenv("PROXY") == "devproxy" {
		return proxyRunner{}
	}
	bin := os.Getenv("ENVOY")
	if bin == "" {
		bin = filepath.Join(binDir, "envoy")
	}
	if _, err := os.Stat(bin); err != nil {
		return proxyRunner{}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return proxyRunner{}
	}
	v := ""
	if m := regexp.MustCompile(`/(\d+\.\d+\.\d+)/`).FindSubmatch(out); m != nil {
		v = string(m[1])
	}
	return proxyRunner{envoyBin: bin, version: v}
}

// name is what make run calls the proxy in its messages.
func (r proxyRunner) name() string {
	if r.envoyBin == "" {
		return "dev proxy"
	}
	return "Envoy " + r.version
}

// the is name with the article a sentence needs: "the dev proxy", "Envoy 1.40.0".
func (r proxyRunner) the() string {
	if r.envoyBin == "" {
		return "the dev proxy"
	}
	return r.name()
}

// logName is the process log of proxy n (1 or 2) in RUN_DIR, without ".log".
func (r proxyRunner) logName(n int) string {
	base := "devproxy"
	if r.envoyBin != "" {
		base = "envoy"
	}
	if n > 1 {
		base += strconv.Itoa(n)
	}
	return base
}

// proxySpec is one proxy of make run.
type proxySpec struct {
	n                     int // 1 or 2
	listen, admin, up, cp string
	accessLog, node       string
	config, binDir        string
	runDir, workers       string // workers: Envoy's --concurrency, the dev proxy's --workers
}

// command returns the binary and arguments that run p. For Envoy it writes
// RUN_DIR/envoy-<n>.yaml: the bootstrap with make run's addresses, access log
// and module (bootstrap.Apply, the same rewrite the tests use).
func (r proxyRunner) command(p proxySpec) (string, []string, error) {
	wasm, err := filepath.Abs(filepath.Join(p.binDir, "sluice.wasm"))
	if err != nil {
		return "", nil, err
	}
	if r.envoyBin == "" {
		args := []string{"--config", p.config, "--wasm", wasm, "--listen", p.listen, "--upstream", p.up,
			"--cluster", "control_plane=" + p.cp, "--access-log", p.accessLog, "--workers", p.workers, "--admin", p.admin}
		if p.n > 1 {
			args = append(args, "--service-node", p.node) // another Envoy: its own node id
		}
		return filepath.Join(p.binDir, "sluice-devproxy"), args, nil
	}
	src, err := os.ReadFile(p.config)
	if err != nil {
		return "", nil, err
	}
	log, err := filepath.Abs(p.accessLog)
	if err != nil {
		return "", nil, err
	}
	out, err := bootstrap.Apply(src, bootstrap.Rewrite{Listeners: []string{p.listen}, Admin: p.admin, AccessLog: log,
		Clusters: map[string]string{"upstream": p.up, "control_plane": p.cp}, Files: map[string]string{"build/sluice.wasm": wasm}})
	if err != nil {
		return "", nil, errors.New(p.config + ": " + err.Error())
	}
	cfg := filepath.Join(p.runDir, "envoy-"+strconv.Itoa(p.n)+".yaml")
	if err := os.WriteFile(cfg, out, 0o644); err != nil {
		return "", nil, err
	}
	// --file-flush-min-size-kb 0: each access-log line is written at once, so
	// `tail` right after a request shows it (the default buffers up to 64 KiB
	// for up to a second).
	return r.envoyBin, []string{"-c", cfg, "--concurrency", p.workers, "--use-dynamic-base-id", "--service-node", p.node,
		"--file-flush-min-size-kb", "0", "--log-level", "warn", "--component-log-level", "wasm:info"}, nil
}

// envoyVersionLine matches the filter's "policy <name> version <n> in use" line
// in Envoy's log, whose second bracket is the logging thread: one per worker.
var envoyVersionLine = regexp.MustCompile(`\]\[(\d+)\]\[info\]\[wasm\].*sluice: policy (\S+) version (\d+) in use`)

// allEnvoyWorkersAt reports whether workers threads of Envoy's log have each
// last logged policy at version or later.
func allEnvoyWorkersAt(log []byte, policy string, version uint64, workers int) bool {
	last := map[string]uint64{}
	for _, m := range envoyVersionLine.FindAllSubmatch(log, -1) {
		if string(m[2]) != policy {
			continue
		}
		if v, err := strconv.ParseUint(string(m[3]), 10, 64); err == nil {
			last[string(m[1])] = v
		}
	}
	at := 0
	for _, v := range last {
		if v >= version {
			at++
		}
	}
	return at >= workers
}

// workersAt is allEnvoyWorkersAt for Envoy, allWorkersAt for the dev proxy.
func (r proxyRunner) workersAt(log []byte, policy string, version uint64, workers int) bool {
	if r.envoyBin != "" {
		return allEnvoyWorkersAt(log, policy, version, workers)
	}
	return allWorkersAt(log, policy, version, workers)
}

// describe is the line make run prints about the proxies.
func (r proxyRunner) describe() string {
	if r.envoyBin == "" {
		return "the dev proxy (testenv/devproxy on wazero; `make envoy` installs the real Envoy, which make run then prefers)"
	}
	return "the real Envoy " + r.version + " (" + r.envoyBin + "; PROXY=devproxy for the dev proxy)"
}
