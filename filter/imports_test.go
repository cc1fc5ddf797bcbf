package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// forbiddenImports may not appear in the wasip1 import graph of filter/...
// and shared/...: importing os initialises Go's runtime poller, which
// crashes on Envoy releases whose WASI poll_oneoff answers ENOSYS
// (golang/go#78513; docs/ENVOY.md, WASI and the poll_oneoff crash). The
// others import os.
var forbiddenImports = []string{"os", "fmt", "log", "log/slog", "encoding/json"}

type listedPackage struct {
	ImportPath string
	Imports    []string
	DepOnly    bool
	Error      *struct{ Err string }
}

// TestNoOSInWasmImportGraph runs `go list -deps -json` for GOOS=wasip1
// GOARCH=wasm and fails, naming the import chain, if a forbidden package is
// reachable from a package of ours.
func TestNoOSInWasmImportGraph(t *testing.T) {
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Imports,DepOnly,Error", "./filter/...", "./shared/...")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*listedPackage{}
	var roots []string
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		p := new(listedPackage)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs[p.ImportPath] = p
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	if _, ok := pkgs["github.com/sluice-proxy/sluice/filter/proxywasm"]; !ok {
		t.Fatalf("go list did not list filter/proxywasm; output:\n%.2000s", out)
	}
	for _, root := range roots {
		if p := pkgs[root]; p.Error != nil {
			t.Logf("note: %s: %s", root, p.Error.Err)
		}
	}
	for _, bad := range forbiddenImports {
		if _, ok := pkgs[bad]; !ok {
			continue
		}
		for _, root := range roots {
			if chain := importChain(pkgs, root, bad); chain != nil {
				t.Errorf("%s is in the wasip1 import graph: %s", bad, strings.Join(chain, " -> "))
			}
		}
	}
}

// importChain returns the shortest import path from "from" to "to", or nil.
func importChain(pkgs map[string]*listedPackage, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var chain []string
			for n := cur; n != ""; n = prev[n] {
				chain = append([]string{n}, chain...)
			}
			return chain
		}
		p := pkgs[cur]
		if p == nil {
			continue
		}
		for _, next := range p.Imports {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return nil
}

func TestImportChain(t *testing.T) {
	pkgs := map[string]*listedPackage{
		"a": {ImportPath: "a", Imports: []string{"b", "c"}},
		"b": {ImportPath: "b", Imports: []string{"os"}},
		"c": {ImportPath: "c", Imports: []string{"b"}},
	}
	if got := strings.Join(importChain(pkgs, "a", "os"), " -> "); got != "a -> b -> os" {
		t.Fatalf("importChain = %q", got)
	}
	if got := importChain(pkgs, "c", "a"); got != nil {
		t.Fatalf("importChain(c, a) = %q, want nil", got)
	}
}
