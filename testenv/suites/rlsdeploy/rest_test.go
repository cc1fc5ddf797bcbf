package rlsdeploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheServedRulesAreReadOverRESTAndWritesSayWhereTheyComeFrom: sluice's
// /bin/ratelimit serves the rules it read from the files on its HTTP port
// under sluice's REST paths, read-only: sluicectl get lists and shows them
// (each descriptor rule with its descriptor), and sluicectl apply is refused
// with a message naming the directory the rules come from.
func TestTheServedRulesAreReadOverRESTAndWritesSayWhereTheyComeFrom(t *testing.T) {
	im := impls[1]
	root := t.TempDir()
	(&configMap{dir: filepath.Join(root, "ratelimit", "config")}).put(t, apiConfig("3"))
	d := deploy(t, im, root, nil, "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true")
	ctl := func(stdin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "sluicectl"), append([]string{"--server", "http://" + d.http}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := ctl("", "get"); code != 0 || !strings.Contains(out, "ratelimit") {
		t.Fatalf("sluicectl get: exit %d\n%s", code, out)
	}
	out, code := ctl("", "get", "ratelimit")
	if code != 0 || !strings.Contains(out, "descriptor api: user") || !strings.Contains(out, "3") {
		t.Fatalf("sluicectl get ratelimit: exit %d\n%s", code, out)
	}
	out, code = ctl(`{"policy":"ratelimit","rules":[]}`, "apply", "-f", "-")
	t.Logf("sluicectl apply:\n%s", out)
	if code == 0 || !strings.Contains(out, "read_only") || !strings.Contains(out, filepath.Join(root, "ratelimit", "config")) {
		t.Fatalf("sluicectl apply: exit %d, want a refusal naming where the rules come from\n%s", code, out)
	}
}
