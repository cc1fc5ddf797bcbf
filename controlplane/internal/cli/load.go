package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	goyaml "github.com/goccy/go-yaml"
	goyamlparser "github.com/goccy/go-yaml/parser"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// A policyFile is one policy read from a file: its name, the validated
// policy and its canonical JSON (rules.EncodePolicy).
type policyFile struct {
	File   string // the path as given, "-" for standard input
	Name   string
	Policy *rules.Policy
	Doc    []byte
	// Version is the file's "version" member: the server version it was exported
	// at (sluicectl get), 0 when absent. It is not sent: the server numbers versions.
	Version uint64
}

// Problem is one validation problem of a file: file, line (0 if unknown),
// field (a JSON path such as "rules[1].limit"; "" for the document) and
// message.
type Problem struct {
	// File is the path as given ("-" for standard input).
	File string
	// Field is the JSON path; "" for the document as a whole.
	Field string
	// Message says what is wrong.
	Message string
	// Line is the 1-based line of the field, 0 when unknown.
	Line int
	// Column is the 1-based column of a syntax error, 0 when unknown.
	Column int
}

// String is "file:line: field: message", parts left out when unknown.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteString(":" + strconv.Itoa(p.Line))
		if p.Column > 0 {
			b.WriteString(":" + strconv.Itoa(p.Column))
		}
	}
	b.WriteString(": ")
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// invalidFiles is the error of loadPolicies when a file does not validate.
type invalidFiles []Problem

func (e invalidFiles) Error() string {
	lines := make([]string, len(e))
	for i, p := range e {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// policyExts are the file name extensions read from a directory.
var policyExts = map[string]bool{".json": true, ".yaml": true, ".yml": true}

// expandPaths turns -f arguments into files: a directory stands for its
// *.json, *.yaml and *.yml files (not recursive, sorted), "-" for standard
// input.
func expandPaths(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		if p == "-" {
			out = append(out, p)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		var names []string
		for _, e := range ents {
			if !e.IsDir() && policyExts[strings.ToLower(filepath.Ext(e.Name()))] {
				names = append(names, filepath.Join(p, e.Name()))
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: no *.json, *.yaml or *.yml file", p)
		}
		sort.Strings(names)
		out = append(out, names...)
	}
	if len(out) == 0 {
		return nil, errors.New("no file given (-f FILE|DIR|-)")
	}
	return out, nil
}

// loadPolicies reads and validates every file of paths. A file that does
// not validate makes it return invalidFiles with every problem of every
// file; other errors (unreadable file, a policy named twice) are returned
// as they are.
func loadPolicies(paths []string, stdin io.Reader) ([]policyFile, error) {
	files, err := expandPaths(paths)
	if err != nil {
		return nil, err
	}
	var out []policyFile
	var problems invalidFiles
	seen := map[string]string{}
	for _, f := range files {
		var data []byte
		if f == "-" {
			data, err = io.ReadAll(io.LimitReader(stdin, 16<<20))
		} else {
			data, err = os.ReadFile(f)
		}
		if err != nil {
			return nil, err
		}
		pf, probs := parsePolicyFile(f, data)
		if len(probs) > 0 {
			problems = append(problems, probs...)
			continue
		}
		if other, dup := seen[pf.Name]; dup {
			return nil, fmt.Errorf("%s and %s both define policy %q", other, f, pf.Name)
		}
		seen[pf.Name] = f
		out = append(out, pf)
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return out, nil
}

// parsePolicyFile reads a policy file: a .json file as strict JSON
// (parseJSONFile), anything else (YAML, or JSON from standard input) through
// YAML, converted to JSON; then it validates it as the control plane does
// (validateDocument). Problems carry the line of the offending field where
// the parser knows it.
func parsePolicyFile(file string, data []byte) (policyFile, []Problem) {
	if strings.EqualFold(filepath.Ext(file), ".json") {
		return parseJSONFile(file, data)
	}
	pf := policyFile{File: file}
	prob := func(field, msg string, line int) []Problem {
		return []Problem{{File: file, Field: field, Message: msg, Line: line}}
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		line, col, msg := syntaxError(data, err)
		p := prob("", "not valid YAML or JSON: "+msg, line)
		p[0].Column = col
		return pf, p
	}
	var second yaml.Node
	if err := dec.Decode(&second); !errors.Is(err, io.EOF) {
		line := second.Line
		if err != nil {
			line = yamlErrLine(err)
		}
		return pf, prob("", "more than one YAML document: a file holds one policy (split the documents after \"---\" into files)", line)
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return pf, prob("", "empty document", 0)
	}
	var v any
	if err := root.Decode(&v); err != nil {
		// e.g. "yaml: unmarshal errors:\n  line 3: mapping key "rules" already defined at line 2"
		msg := strings.TrimSpace(strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:"))
		if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
			msg = msg[i+2:]
		}
		return pf, prob("", msg, yamlErrLine(err))
	}
	if _, ok := v.(map[string]any); !ok {
		return pf, prob("", "the document must be an object (a mapping) with \"policy\" and \"rules\"", root.Content[0].Line)
	}
	doc, err := json.Marshal(v)
	if err != nil {
		return pf, prob("", "cannot convert to JSON: "+err.Error(), 0)
	}
	return validateDocument(file, rules.DecodePolicy(doc), func(fe rules.FieldError) (int, int) { return lineOf(&root, fe.Field), 0 })
}

// parseJSONFile reads a .json policy file as the control plane reads a PUT body:
// its very bytes, strict JSON (rules.DecodePolicy), so that what the server would
// refuse (a trailing comma, a comment, a duplicate member) is refused here, at its
// line and column.
func parseJSONFile(file string, data []byte) (policyFile, []Problem) {
	var root yaml.Node // for the lines of fields, when YAML reads the document too
	if err := yaml.Unmarshal(data, &root); err != nil {
		root = yaml.Node{}
	}
	return validateDocument(file, rules.DecodePolicy(data), func(fe rules.FieldError) (int, int) {
		if fe.Decoding {
			return lineColumn(data, fe.Offset)
		}
		return lineOf(&root, fe.Field), 0
	})
}

// lineColumn is the 1-based line and column of byte offset off in data.
func lineColumn(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	line = 1 + bytes.Count(data[:off], []byte("\n"))
	return line, off - bytes.LastIndexByte(data[:off], '\n')
}

// validateDocument validates a decoded policy document of file as the control
// plane does: "policy" may be absent, and then is the file's name without its
// extension; "rules" is required. at gives a problem's line and column (0 when
// unknown).
func validateDocument(file string, d *rules.Document, at func(rules.FieldError) (line, col int)) (policyFile, []Problem) {
	pf := policyFile{File: file}
	prob := func(field, msg string) []Problem {
		return []Problem{{File: file, Field: field, Message: msg}}
	}
	if d.Missing("policy") {
		if file == "-" {
			return pf, prob("policy", `required when reading standard input (the name of the policy)`)
		}
		name := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
		if !rules.ValidName(name) {
			return pf, prob("policy", "absent, and the file name "+strconv.Quote(name)+" is not a valid policy name (1 to 63 bytes of [a-z0-9_.-] starting with [a-z0-9]); set \"policy\"")
		}
		d.Policy.Name = name
	}
	p, err := d.Validate()
	var probs []Problem
	if err != nil {
		var errs rules.Errors
		if !errors.As(err, &errs) {
			return pf, prob("", err.Error())
		}
		for _, fe := range errs {
			line, col := at(fe)
			probs = append(probs, Problem{File: file, Field: fe.Field, Message: fe.Message, Line: line, Column: col})
		}
	}
	if d.Missing("rules") {
		probs = append(probs, Problem{File: file, Field: "rules", Message: `required: a policy replaces the whole policy; write "rules: []" for a policy without rules`})
	}
	if len(probs) > 0 {
		return pf, probs
	}
	pf.Version, p.Version = p.Version, 0
	pf.Name, pf.Policy, pf.Doc = p.Name, p, rules.EncodePolicy(p)
	return pf, nil
}

// yamlErrLine finds "line N" in a YAML parser error, 0 if none.
// syntaxError locates a document's syntax error: the YAML decoder's error
// names the line of the enclosing construct, often the line before the fault,
// so the position (line, column) and message come from github.com/goccy/go-yaml's
// parser, which points at the offending token; the decoder's own line and
// message stand when that parser finds nothing wrong.
func syntaxError(data []byte, err error) (line, col int, msg string) {
	var se *goyaml.SyntaxError
	if _, perr := goyamlparser.ParseBytes(data, 0); errors.As(perr, &se) && se.Token != nil && se.Token.Position != nil {
		return se.Token.Position.Line, se.Token.Position.Column, se.Message
	}
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if strings.Contains(msg, "did not find expected ',' or '}'") || strings.Contains(msg, "did not find expected ',' or ']'") {
		// A plain value holding "?" (a query string) or ": " inside {…} or […]:
		// the reader stops there, and names the line the brackets open on.
		msg += ` (inside {…} or […], quote a value holding "?" or ": ", e.g. path: "/search?q=a")`
	}
	return yamlErrLine(err), 0, msg
}

func yamlErrLine(err error) int {
	s := err.Error()
	i := strings.Index(s, "line ")
	if i < 0 {
		return 0
	}
	j := i + 5
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(s[i+5 : j])
	return n
}

// lineOf returns the line of the node at a JSON path such as
// "rules[2].match.headers[0].name" in a parsed YAML document, or of the
// deepest node on the way that exists; 0 for the document as a whole.
func lineOf(root *yaml.Node, field string) int {
	if field == "" || len(root.Content) == 0 {
		return 0
	}
	n := root.Content[0]
	line := n.Line
	for _, seg := range splitPath(field) {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		var next *yaml.Node
		switch {
		case seg.index >= 0 && n.Kind == yaml.SequenceNode && seg.index < len(n.Content):
			next = n.Content[seg.index]
		case seg.index < 0 && n.Kind == yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == seg.key {
					next = n.Content[i+1]
					line = n.Content[i].Line
					break
				}
			}
		}
		if next == nil {
			return line
		}
		n = next
		line = n.Line
	}
	return line
}

type pathSeg struct {
	key   string
	index int // -1 for a key
}

// splitPath splits "a.b[2].c" into a, b, [2], c.
func splitPath(p string) []pathSeg {
	var out []pathSeg
	for _, part := range strings.Split(p, ".") {
		key := part
		rest := ""
		if i := strings.IndexByte(part, '['); i >= 0 {
			key, rest = part[:i], part[i:]
		}
		if key != "" {
			out = append(out, pathSeg{key: key, index: -1})
		}
		for strings.HasPrefix(rest, "[") {
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				break
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil {
				break
			}
			out = append(out, pathSeg{index: n})
			rest = rest[end+1:]
		}
	}
	return out
}
