package cli

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-proxy/sluice/controlplane/internal/lab"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// A labFile is one test file of sluicectl test (docs/lab.md): a policy,
// the workers of the simulated Envoy, and tests of timed requests with the
// answers they must get.
type labFile struct {
	file    string
	policy  *rules.Policy
	workers int
	tests   []labTest
}

type labTest struct {
	name  string
	line  int
	steps []labStep
}

// labStep sends count identical requests at virtual time at (since the test
// began) and checks each answer.
type labStep struct {
	line          int
	at            time.Duration
	method, path  string
	headers       [][2]string
	clientIP      string
	count         int
	expect        int // 0: any status
	expectHeaders [][2]string
	// domain and descriptor, when set, make the step a rate limit service
	// descriptor (Envoy's ratelimit filter's), hits its hits_addend.
	domain     string
	descriptor [][2]string
	hits       uint64
}

// maxStepCount bounds a step's count, so a typo cannot run for hours.
const maxStepCount = 1_000_000

func labTestCmd(env *Env) *cobra.Command {
	var wasm, junit string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "test FILE...",
		Short: "Run policy test files through the real filter, offline, on a virtual clock",
		Long: `Run test files: each names a policy (a file as apply takes it, relative to the test
file, or inline) and tests of timed requests with the status and headers they must get.
Every test starts from empty counters and runs through the filter module Envoy loads
(embedded in sluicectl, or --wasm), under the wazero host, on a virtual clock, with
"workers" VMs sharing data as an Envoy's workers do. Fleet rules count against their
fleet limit as one budget, through an in-process quota service. See docs/lab.md.

Exit codes: 0 every test passed; 1 a test failed; 2 a file or flag is invalid (file:line
named); 3 the filter failed.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var files []*labFile
			var probs invalidFiles
			for _, a := range args {
				lf, p := loadLabFile(a)
				probs = append(probs, p...)
				if lf != nil {
					files = append(files, lf)
				}
			}
			if len(probs) > 0 {
				return withCode(ExitUsage, fmt.Errorf("invalid test file (nothing was run):\n%s", probs.Error()))
			}
			if junit != "" {
				if err := checkWritable("--junit", junit); err != nil {
					return err
				}
			}
			bin, _, err := lab.Module(wasm)
			if err != nil {
				return withCode(ExitUsage, err)
			}
			lab.CacheCompiled()
			var suites []junitSuite
			passed, failed := 0, 0
			for _, lf := range files {
				s, err := runLabFile(cmd, env, bin, lf, verbose)
				if err != nil {
					return withCode(ExitServer, err)
				}
				suites = append(suites, s)
				failed += s.Failures
				passed += s.Tests - s.Failures
			}
			fmt.Fprintf(env.Stdout, "%d passed, %d failed\n", passed, failed)
			if junit != "" {
				if err := writeJUnit(junit, suites); err != nil {
					return withCode(ExitUsage, err)
				}
			}
			if failed > 0 {
				return withCode(ExitDiff, nil)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&wasm, "wasm", "", "filter module to run (default: the one built into sluicectl)")
	cmd.Flags().StringVar(&junit, "junit", "", "also write the results as JUnit XML to this file (for CI)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print every decision as the access log's rate_limit shows it")
	return cmd
}

// runLabFile runs every test of lf and prints a line per test (and, for a
// failure, what was expected and what came back).
func runLabFile(cmd *cobra.Command, env *Env, bin []byte, lf *labFile, verbose bool) (junitSuite, error) {
	suite := junitSuite{Name: lf.file}
	began := time.Now()
	for _, t := range lf.tests {
		start := time.Now()
		fail, err := runLabTest(cmd, env, bin, lf, t, verbose)
		if err != nil {
			return suite, fmt.Errorf("%s:%d: %s: %w", lf.file, t.line, t.name, err)
		}
		tc := junitCase{Class: lf.file, Name: t.name, Time: secs(time.Since(start))}
		if fail == "" {
			fmt.Fprintf(env.Stdout, "ok    %s: %s\n", lf.file, t.name)
		} else {
			fmt.Fprintf(env.Stdout, "FAIL  %s: %s\n%s", lf.file, t.name, indent(fail, "      "))
			tc.Failure = &junitFailure{Message: firstLine(fail), Text: fail}
			suite.Failures++
		}
		suite.Tests++
		suite.Cases = append(suite.Cases, tc)
	}
	suite.Time = secs(time.Since(began))
	return suite, nil
}

// runLabTest runs one test from empty counters; it returns "" when every
// answer was as expected, else what went wrong at the first step that failed.
func runLabTest(cmd *cobra.Command, env *Env, bin []byte, lf *labFile, t labTest, verbose bool) (string, error) {
	f, err := lab.NewFleet(ctxOf(cmd), lab.Config{Wasm: bin, Policy: lf.policy, Workers: lf.workers})
	if err != nil {
		return "", err
	}
	defer f.Close()
	start := f.Now()
	for si, s := range t.steps {
		if err := f.AdvanceTo(start.Add(s.at)); err != nil {
			return "", err
		}
		for i := range s.count {
			var d lab.Decision
			var err error
			if s.domain != "" {
				d, err = f.DoDescriptor(lab.Descriptor{Domain: s.domain, Entries: s.descriptor, Hits: s.hits})
			} else {
				d, err = f.Do(lab.Request{Method: s.method, Path: s.path, Headers: s.headers, ClientIP: s.clientIP})
			}
			if err != nil {
				return "", err
			}
			if verbose {
				fmt.Fprintf(env.Stdout, "      step %d #%d at %s: %s -> %d %s\n", si+1, i+1, s.at, s.describe(), d.Status, noDecision(d.RawRateLimit))
			}
			if msg := s.check(d); msg != "" {
				req := fmt.Sprintf("step %d (%s:%d), request %d of %d at %s: %s\n", si+1, lf.file, s.line, i+1, s.count, s.at, s.describe())
				return req + msg + "rate_limit: " + noDecision(d.RawRateLimit) + "\n", nil
			}
		}
	}
	return "", nil
}

// check compares a decision with the step's expectations: "" when it
// matches, else one line per difference.
func (s *labStep) check(d lab.Decision) string {
	var b strings.Builder
	if s.expect != 0 && d.Status != s.expect {
		fmt.Fprintf(&b, "expected status %d, got %d\n", s.expect, d.Status)
	}
	for _, kv := range s.expectHeaders {
		got, ok := d.Headers.Lookup(kv[0])
		switch {
		case !ok:
			fmt.Fprintf(&b, "expected header %s: %q, got none\n", kv[0], kv[1])
		case got != kv[1]:
			fmt.Fprintf(&b, "expected header %s: %q, got %q\n", kv[0], kv[1], got)
		}
	}
	return b.String()
}

// describe is the step's request as one line: method, path, headers, client.
func (s *labStep) describe() string {
	var b strings.Builder
	if s.domain != "" {
		b.WriteString("descriptor " + s.domain)
		for _, kv := range s.descriptor {
			b.WriteString(" " + kv[0] + "=" + kv[1])
		}
		if s.hits > 0 {
			b.WriteString(" hits " + strconv.FormatUint(s.hits, 10))
		}
		return b.String()
	}
	b.WriteString(s.method + " " + s.path)
	for _, kv := range s.headers {
		b.WriteString(" " + kv[0] + "=" + kv[1])
	}
	if s.clientIP != "" {
		b.WriteString(" from " + s.clientIP)
	}
	return b.String()
}

// noDecision is how a decision without filter state (no rule applied) prints.
func noDecision(s string) string {
	if s == "" {
		return "null"
	}
	return s
}

func indent(s, pfx string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(pfx + l)
		}
	}
	return b.String()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) }

// loadLabFile reads and checks a test file; problems name its lines.
func loadLabFile(file string) (*labFile, []Problem) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, []Problem{{File: file, Message: err.Error()}}
	}
	p := &labParser{file: file}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		line, col, msg := syntaxError(data, err)
		return nil, []Problem{{File: file, Message: "not valid YAML: " + msg, Line: line, Column: col}}
	}
	if err := resolveAliases(&root, 0); err != nil {
		return nil, []Problem{{File: file, Message: err.Error(), Line: max(root.Line, 1)}}
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, []Problem{{File: file, Message: `the document must be a mapping with "policy" and "tests"`, Line: max(root.Line, 1)}}
	}
	lf := &labFile{file: file, workers: 1}
	var policyNode, testsNode *yaml.Node
	p.fields(root.Content[0], "", func(key string, v *yaml.Node) {
		switch key {
		case "policy":
			policyNode = v
		case "workers":
			lf.workers = p.intIn(v, "workers", 1, 64)
		case "tests":
			testsNode = v
		default:
			p.add(v.Line, key, `unknown field (want "policy", "workers" or "tests")`)
		}
	})
	if policyNode == nil {
		p.add(root.Content[0].Line, "policy", "required: a policy file (relative to this file) or an inline policy")
	} else {
		lf.policy = p.policy(policyNode)
	}
	if testsNode == nil || testsNode.Kind != yaml.SequenceNode || len(testsNode.Content) == 0 {
		line := root.Content[0].Line
		if testsNode != nil {
			line = testsNode.Line
		}
		p.add(line, "tests", "required: a list of at least one test")
	} else {
		names := map[string]int{}
		for i, tn := range testsNode.Content {
			t := p.test(tn, "tests["+strconv.Itoa(i)+"]")
			if prev, dup := names[t.name]; dup && t.name != "" {
				p.add(tn.Line, "tests["+strconv.Itoa(i)+"].name", fmt.Sprintf("%q is also the name of the test at line %d", t.name, prev))
			}
			names[t.name] = tn.Line
			lf.tests = append(lf.tests, t)
		}
	}
	if len(p.probs) > 0 {
		return nil, p.probs
	}
	return lf, nil
}

// labParser collects the problems of one test file.
type labParser struct {
	file  string
	probs []Problem
}

// mergeTag is the tag the YAML parser gives a plain "<<" key, a merge key (a
// quoted "<<" is an ordinary string key).
const mergeTag = "!!merge"

// maxAliasDepth bounds how deep resolveAliases follows nested aliases, so that
// an alias of a node that holds itself ends with an error.
const maxAliasDepth = 32

// resolveAliases replaces every alias (*name) in n by a copy of what its anchor
// (&name) names, and merges a mapping's "<<" keys (<<: *name, or a sequence of
// them) into it, keys given in the mapping itself winning, as YAML 1.1's merge
// key says (https://yaml.org/type/merge.html): a test file may write a step
// once and reuse it.
func resolveAliases(n *yaml.Node, depth int) error {
	if depth > maxAliasDepth {
		return fmt.Errorf("aliases nested more than %d deep (an anchor that holds its own alias?)", maxAliasDepth)
	}
	for i, c := range n.Content {
		if c.Kind == yaml.AliasNode && c.Alias != nil {
			cp := *c.Alias
			cp.Content = append([]*yaml.Node(nil), c.Alias.Content...)
			n.Content[i] = &cp
		}
		if err := resolveAliases(n.Content[i], depth+1); err != nil {
			return err
		}
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	var own, merged []*yaml.Node
	has := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Tag != mergeTag {
			own = append(own, k, n.Content[i+1])
			has[k.Value] = true
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Tag != mergeTag {
			continue
		}
		v := n.Content[i+1]
		sources := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			sources = v.Content
		}
		for _, src := range sources {
			if src.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: a merge key (<<) takes a mapping or a list of mappings", src.Line)
			}
			for j := 0; j+1 < len(src.Content); j += 2 {
				if k := src.Content[j].Value; !has[k] {
					has[k] = true
					merged = append(merged, src.Content[j], src.Content[j+1])
				}
			}
		}
	}
	if len(merged) > 0 || len(own) != len(n.Content) {
		n.Content = append(own, merged...)
	}
	return nil
}

func (p *labParser) add(line int, field, msg string) {
	p.probs = append(p.probs, Problem{File: p.file, Line: line, Field: field, Message: msg})
}

// fields calls f for each key of mapping n; a node that is not a mapping is a
// problem at field.
func (p *labParser) fields(n *yaml.Node, field string, f func(key string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, field, "must be a mapping")
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		f(n.Content[i].Value, n.Content[i+1])
	}
}

func (p *labParser) scalar(v *yaml.Node, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		p.add(v.Line, field, "must be a single value")
		return "", false
	}
	return v.Value, true
}

func (p *labParser) intIn(v *yaml.Node, field string, lo, hi int) int {
	s, ok := p.scalar(v, field)
	if !ok {
		return lo
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		p.add(v.Line, field, fmt.Sprintf("must be a whole number %d..%d, got %q", lo, hi, s))
		return lo
	}
	return n
}

// policy reads "policy": a file name relative to the test file, or an inline
// policy document; it is validated as apply validates it.
func (p *labParser) policy(v *yaml.Node) *rules.Policy {
	if v.Kind == yaml.ScalarNode {
		path := v.Value
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(p.file), path)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			p.add(v.Line, "policy", err.Error())
			return nil
		}
		pf, probs := parsePolicyFile(path, data)
		if len(probs) > 0 {
			for _, pr := range probs {
				pr.Message = fmt.Sprintf("%s (policy of %s:%d)", pr.Message, p.file, v.Line)
				p.probs = append(p.probs, pr)
			}
			return nil
		}
		return pf.Policy
	}
	if v.Kind != yaml.MappingNode {
		p.add(v.Line, "policy", "must be a file name or an inline policy (a mapping)")
		return nil
	}
	var doc any
	if err := v.Decode(&doc); err != nil {
		p.add(v.Line, "policy", err.Error())
		return nil
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		p.add(v.Line, "policy", "cannot convert to JSON: "+err.Error())
		return nil
	}
	d := rules.DecodePolicy(raw)
	if d.Missing("policy") {
		d.Policy.Name = "lab"
	}
	pol, err := d.Validate()
	if err != nil {
		var errs rules.Errors
		if !errors.As(err, &errs) {
			p.add(v.Line, "policy", err.Error())
			return nil
		}
		wrap := &yaml.Node{Content: []*yaml.Node{v}}
		for _, fe := range errs {
			line := lineOf(wrap, fe.Field)
			if line == 0 {
				line = v.Line
			}
			p.add(line, "policy."+fe.Field, fe.Message)
		}
		return nil
	}
	return pol
}

func (p *labParser) test(n *yaml.Node, field string) labTest {
	t := labTest{line: n.Line}
	var steps *yaml.Node
	p.fields(n, field, func(key string, v *yaml.Node) {
		switch key {
		case "name":
			t.name, _ = p.scalar(v, field+".name")
		case "steps":
			steps = v
		default:
			p.add(v.Line, field+"."+key, `unknown field (want "name" or "steps")`)
		}
	})
	if t.name == "" {
		p.add(n.Line, field+".name", "required")
	}
	if steps == nil || steps.Kind != yaml.SequenceNode || len(steps.Content) == 0 {
		p.add(n.Line, field+".steps", "required: a list of at least one step")
		return t
	}
	var last time.Duration
	for i, sn := range steps.Content {
		sf := field + ".steps[" + strconv.Itoa(i) + "]"
		s := p.step(sn, sf)
		if s.at < last {
			p.add(s.line, sf+".at", fmt.Sprintf("%s is before the previous step's %s: steps run in time order", s.at, last))
		}
		last = max(last, s.at)
		t.steps = append(t.steps, s)
	}
	return t
}

func (p *labParser) step(n *yaml.Node, field string) labStep {
	s := labStep{line: n.Line, method: "GET", count: 1}
	havePath := false
	p.fields(n, field, func(key string, v *yaml.Node) {
		f := field + "." + key
		switch key {
		case "at":
			if str, ok := p.scalar(v, f); ok {
				d, err := time.ParseDuration(str)
				if err != nil || d < 0 {
					p.add(v.Line, f, fmt.Sprintf("must be a duration since the test began such as 0s, 1.5s or 2m, got %q", str))
				}
				s.at = max(d, 0)
			}
		case "method":
			if str, ok := p.scalar(v, f); ok {
				if str == "" || strings.ContainsAny(str, " \t\r\n") {
					p.add(v.Line, f, fmt.Sprintf("must be an HTTP method such as GET, got %q", str))
				}
				s.method = str
			}
		case "path":
			if str, ok := p.scalar(v, f); ok {
				if !strings.HasPrefix(str, "/") {
					p.add(v.Line, f, fmt.Sprintf("must start with /, got %q", str))
				}
				s.path, havePath = str, true
			}
		case "headers", "expect_headers":
			var hs [][2]string
			p.fields(v, f, func(name string, hv *yaml.Node) {
				val, _ := p.scalar(hv, f+"."+name)
				if name == "" || strings.ContainsAny(name, " \t\r\n:") {
					p.add(hv.Line, f, fmt.Sprintf("header name %q is not valid", name))
				}
				hs = append(hs, [2]string{strings.ToLower(name), val})
			})
			if key == "headers" {
				s.headers = hs
			} else {
				s.expectHeaders = hs
			}
		case "client_ip":
			if str, ok := p.scalar(v, f); ok {
				if _, err := netip.ParseAddr(str); err != nil {
					p.add(v.Line, f, fmt.Sprintf("must be an IPv4 or IPv6 address, got %q", str))
				}
				s.clientIP = str
			}
		case "domain":
			s.domain, _ = p.scalar(v, f)
			if s.domain == "" {
				p.add(v.Line, f, "must not be empty")
			}
		case "descriptor":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				p.add(v.Line, f, "must be a list of entries such as [{generic_key: api}, {x-user-id: alice}]")
				break
			}
			for i, e := range v.Content {
				ef := f + "[" + strconv.Itoa(i) + "]"
				if e.Kind != yaml.MappingNode || len(e.Content) != 2 {
					p.add(e.Line, ef, "must be one key: value entry such as {generic_key: api}")
					continue
				}
				val, _ := p.scalar(e.Content[1], ef)
				s.descriptor = append(s.descriptor, [2]string{e.Content[0].Value, val})
			}
		case "hits":
			s.hits = uint64(p.intIn(v, f, 0, maxStepCount))
		case "count":
			s.count = p.intIn(v, f, 1, maxStepCount)
		case "expect":
			s.expect = p.intIn(v, f, 100, 599)
		default:
			p.add(v.Line, f, `unknown field (want at, method, path, headers, client_ip, count, expect or expect_headers; or domain, descriptor and hits for a rate limit descriptor)`)
		}
	})
	switch {
	case (s.domain != "") != (s.descriptor != nil):
		p.add(n.Line, field, "domain and descriptor go together (a rate limit descriptor step)")
	case s.domain != "" && (havePath || s.headers != nil || s.clientIP != ""):
		p.add(n.Line, field, "a descriptor step has no path, headers or client_ip")
	case s.domain == "" && !havePath:
		p.add(n.Line, field+".path", "required")
	case s.domain == "" && s.hits != 0:
		p.add(n.Line, field+".hits", "only with a descriptor")
	}
	return s
}

// JUnit XML, as CI systems read it (the schema of Ant's JUnit report).
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Class   string        `xml:"classname,attr"`
	Name    string        `xml:"name,attr"`
	Time    string        `xml:"time,attr"`
	Failure *junitFailure `xml:"failure,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func writeJUnit(path string, suites []junitSuite) error {
	all := junitSuites{Suites: suites}
	for _, s := range suites {
		all.Tests += s.Tests
		all.Failures += s.Failures
	}
	var b bytes.Buffer
	b.WriteString(xml.Header)
	enc := xml.NewEncoder(&b)
	enc.Indent("", "  ")
	if err := enc.Encode(all); err != nil {
		return err
	}
	b.WriteByte('\n')
	return writeFileAtomic(path, b.Bytes())
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, so a reader never sees half a file.
// checkWritable tells, before a run, whether path (given as flag) can be written
// the way writeFileAtomic writes it: a file created beside it and renamed.
// Errors: a usage error naming the flag.
func checkWritable(flag, path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return withCode(ExitUsage, fmt.Errorf("%s %s: cannot be written: %w", flag, path, err))
	}
	tmp.Close()
	return os.Remove(tmp.Name())
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := io.Copy(tmp, bytes.NewReader(data))
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
	}
	return werr
}
