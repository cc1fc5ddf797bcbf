package envoyproc

import (
	"os"
	"path/filepath"
	"testing"
)

// TestALineEnvoyIsStillWritingIsNotReadYet: an access log read while Envoy
// writes it may end in part of a line, without its newline; the complete
// lines are returned and the part is left for a later read.
func TestALineEnvoyIsStillWritingIsNotReadYet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, []byte("{\"n\":1}\n{\"n\":2}\n{\"client_ip\":\"127.0.0.1\",\"pa"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := ReadJSONLines(t, path); len(got) != 2 || got[1]["n"] != 2.0 {
		t.Fatalf("read %v, want the two complete lines", got)
	}
}
