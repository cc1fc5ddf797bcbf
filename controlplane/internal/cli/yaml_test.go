package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// TestYAMLOutputAppliesBack: get -o yaml of the demo policy keeps the
// document's member order and parses back to the same policy.
func TestYAMLOutputAppliesBack(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "default-policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := rules.ParsePolicy(doc)
	if err != nil {
		t.Fatal(err)
	}
	canonical := rules.EncodePolicy(p)
	y, err := jsonToYAML(canonical)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(y, []byte("policy: default\n")) || !bytes.Contains(y, []byte("  - id: api-per-user\n")) {
		t.Fatalf("YAML:\n%s", y)
	}
	pf, probs := parsePolicyFile("default.yaml", y)
	if len(probs) > 0 {
		t.Fatalf("problems %v in\n%s", probs, y)
	}
	p.Version = 0
	if !bytes.Equal(pf.Doc, rules.EncodePolicy(p)) {
		t.Fatalf("round trip:\n%s\n%s", pf.Doc, rules.EncodePolicy(p))
	}
}

func TestOneDocumentPerFile(t *testing.T) {
	_, probs := parsePolicyFile("two.yaml", []byte("policy: a\nrules: []\n---\npolicy: b\nrules: []\n"))
	if len(probs) != 1 || probs[0].Line != 3 || !bytes.Contains([]byte(probs[0].Message), []byte("more than one YAML document")) {
		t.Fatalf("problems %v", probs)
	}
	_, probs = parsePolicyFile("dup.yaml", []byte("policy: a\nrules: []\nrules: []\n"))
	if len(probs) != 1 || probs[0].Line != 3 {
		t.Fatalf("duplicate key: %v", probs)
	}
	_, probs = parsePolicyFile("empty.yaml", nil)
	if len(probs) != 1 {
		t.Fatalf("empty file: %v", probs)
	}
}
