package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestWalkthroughIsReadFromTheREADME: the steps make run prints are the README's:
// six numbered steps, every ```sh command of the walkthrough among them.
func TestWalkthroughIsReadFromTheREADME(t *testing.T) {
	steps, err := walkthrough("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, st := range steps {
		if !strings.HasPrefix(st.title, string(rune('1'+i))+". ") || strings.HasSuffix(st.title, ".") {
			t.Errorf("step %d title %q", i+1, st.title)
		}
		if len(st.commands) == 0 {
			t.Errorf("step %q has no command", st.title)
		}
		n += len(st.commands)
	}
	if len(steps) != 6 || n != 12 {
		t.Fatalf("%d steps, %d commands; want 6 and 12", len(steps), n)
	}
	if steps[0].title != "1. Trip a limit" || !strings.Contains(steps[0].commands[0], "http://127.0.0.1:10000/api/hello") {
		t.Fatalf("step 1: %+v", steps[0])
	}
}

// TestDecisionsCountsEachRule: the live line counts each rule's allowed and limited
// requests from the access logs' rate_limit field, only lines written since the
// last read, a line split across reads once.
func TestDecisionsCountsEachRule(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/access.log"
	old := `{"rate_limit":"{\"rate_limited\":true,\"rule\":\"old\"}"}` + "\n"
	if err := os.WriteFile(f, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDecisions(f, dir+"/missing.log")
	w, _ := os.OpenFile(f, os.O_APPEND|os.O_WRONLY, 0)
	defer w.Close()
	w.WriteString(`{"rate_limit":"{\"rate_limited\":false,\"rule\":\"api\"}"}` + "\n" + `{"rate_limit":null}` + "\n" + `{"rate_limit":"{\"rate_limited\":true,`)
	if got := format(d.read()); got != "api 1 allowed / 0 limited" {
		t.Fatalf("first read: %q", got)
	}
	w.WriteString(`\"rule\":\"api\"}"}` + "\n")
	if got := format(d.read()); got != "api 0 allowed / 1 limited" {
		t.Fatalf("second read: %q", got)
	}
	if got := d.read(); len(got) != 0 {
		t.Fatalf("nothing new: %v", got)
	}
}

// TestASecondRunIsRefusedItsRunDirectory: a run directory one make run holds is
// refused to a second, which is told how to run beside it, and touches nothing
// there; once the first ends, the directory is free again.
func TestASecondRunIsRefusedItsRunDirectory(t *testing.T) {
	dir := t.TempDir() + "/run"
	release, err := lockRunDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	log := dir + "/controlplane.log"
	if err := os.WriteFile(log, []byte("the first run's log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := lockRunDir(dir); err == nil || !strings.Contains(err.Error(), "RUN_DIR="+dir+"2") || !strings.Contains(err.Error(), "pid ") {
		t.Fatalf("a second lock of %s: %v", dir, err)
	}
	if b, _ := os.ReadFile(log); string(b) != "the first run's log\n" {
		t.Fatalf("the first run's log became %q", b)
	}
	release()
	again, err := lockRunDir(dir)
	if err != nil {
		t.Fatalf("after the first run ended: %v", err)
	}
	again()
}

// Envoy's log as Envoy 1.40 writes it: the second bracket is the thread, one per
// worker; the canary on the main thread never logs a version.
func TestAllEnvoyWorkersAt(t *testing.T) {
	log := []byte(`[2026-11-27 19:15:51.169][6318][info][wasm] [source/extensions/common/wasm/context.cc:1151] wasm log sluice sluice: sluice: policy default version 1 in use (8 rules)
[2026-11-27 19:15:51.170][6319][info][wasm] [source/extensions/common/wasm/context.cc:1151] wasm log sluice sluice: sluice: policy default version 1 in use (8 rules)
[2026-11-27 19:16:02.001][6318][info][wasm] [source/extensions/common/wasm/context.cc:1151] wasm log sluice sluice: sluice: policy default version 2 in use (8 rules)
[2026-11-27 19:16:02.002][6318][info][wasm] [source/extensions/common/wasm/context.cc:1151] wasm log sluice sluice: sluice: policy other version 9 in use (1 rules)
`)
	for _, c := range []struct {
		version uint64
		workers int
		want    bool
	}{{1, 2, true}, {2, 2, false}, {2, 1, true}, {1, 3, false}, {9, 1, false}} {
		if got := allEnvoyWorkersAt(log, "default", c.version, c.workers); got != c.want {
			t.Errorf("version %d on %d workers: %v, want %v", c.version, c.workers, got, c.want)
		}
	}
}

// TestHelpListsEveryVariableRead: each variable the command reads (env or
// os.Getenv in its source) is in what -h prints.
func TestHelpListsEveryVariableRead(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?:env|os\.Getenv)\("([A-Z0-9_]+)"`)
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			seen++
			if !regexp.MustCompile(`\b` + m[1] + `\b`).MatchString(usage) {
				t.Errorf("%s reads %s; -h does not list it", f, m[1])
			}
		}
	}
	if seen < 10 {
		t.Fatalf("found %d variables read; the pattern no longer matches the source", seen)
	}
}
