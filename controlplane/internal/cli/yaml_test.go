package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
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

// TestJSONFilesAreReadAsTheServerReadsThem: a .json file is strict JSON, as the
// control plane's PUT reads it: what YAML would forgive (a trailing comma, a
// comment, a single-quoted string, a duplicate member) is a problem at its line
// and column; the same content as .yaml is YAML.
func TestJSONFilesAreReadAsTheServerReadsThem(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"trailing comma", "{\"policy\": \"x\",\n \"rules\": [],\n}", "x.json:3:1"},
		{"comment", "{\"policy\": \"x\", # a comment\n \"rules\": []}", "x.json:1:17"},
		{"single quotes", "{\"policy\": 'x', \"rules\": []}", "x.json:1:12"},
	} {
		pf, probs := parsePolicyFile("x.json", []byte(tc.doc))
		if len(probs) == 0 {
			t.Errorf("%s: accepted as %s", tc.name, pf.Doc)
			continue
		}
		if got := probs[0].String(); !bytes.Contains([]byte(got), []byte(tc.want)) {
			t.Errorf("%s: %q, want it at %s", tc.name, got, tc.want)
		}
	}
	if _, probs := parsePolicyFile("x.yaml", []byte("{\"policy\": \"x\",\n \"rules\": [],\n}")); len(probs) > 0 {
		t.Errorf("the same flow mapping as YAML: %v", probs)
	}
	pf, probs := parsePolicyFile("named.json", []byte("{\"rules\": [{\"id\": \"a\", \"algorithm\": \"fixed_window\", \"limit\": 5, \"window\": \"1m\"}]}"))
	if len(probs) > 0 || pf.Name != "named" {
		t.Fatalf("a valid JSON file without a name: %v %q", probs, pf.Name)
	}
	_, probs = parsePolicyFile("bad.json", []byte("{\"policy\": \"x\",\n \"rules\": [{\"id\": \"a\", \"algorithm\": \"fixed_window\",\n \"limit\": -5, \"window\": \"1m\"}]}"))
	if len(probs) != 1 || probs[0].Field != "rules[0].limit" || probs[0].Line != 3 {
		t.Fatalf("a bad limit: %v", probs)
	}
}

// TestAnUnquotedQueryInAFlowStepSaysToQuoteIt: a step written {…} whose path
// holds an unquoted "?" is refused by the YAML reader; the problem says to quote
// it, and the quoted form loads.
func TestAnUnquotedQueryInAFlowStepSaysToQuoteIt(t *testing.T) {
	dir := t.TempDir()
	body := "policy: p.json\ntests:\n  - name: a\n    steps:\n      - {at: 0s, path: %s, status: 200}\n"
	bad := filepath.Join(dir, "bad.test.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(body, "%s", "/search?q=a", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, probs := loadLabFile(bad)
	if len(probs) != 1 || !strings.Contains(probs[0].Message, `quote a value holding "?"`) {
		t.Fatalf("problems %+v, want one saying to quote the value", probs)
	}
	good := filepath.Join(dir, "good.test.yaml")
	if err := os.WriteFile(good, []byte(strings.Replace(body, "%s", `"/search?q=a"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, probs := loadLabFile(good); len(probs) != 0 && strings.Contains(probs[0].Message, "YAML") {
		t.Fatalf("the quoted path: %+v", probs)
	}
}
