package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// loadFiles reads -f files; an invalid file exits 2 naming each problem.
func loadFiles(env *Env, files []string) ([]policyFile, error) {
	if len(files) == 0 {
		return nil, withCode(ExitUsage, errors.New("-f FILE|DIR|- is required"))
	}
	pfs, err := loadPolicies(files, env.Stdin)
	var inv invalidFiles
	switch {
	case errors.As(err, &inv):
		return nil, withCode(ExitUsage, fmt.Errorf("invalid policy file (nothing was sent to the server):\n%s", inv.Error()))
	case err != nil:
		return nil, withCode(ExitUsage, err)
	}
	return pfs, nil
}

func validateCmd(env *Env) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "validate -f FILE|DIR|-",
		Short: "Check policy files offline, with the control plane's own validation",
		Long: `Check policy files (YAML or JSON) without contacting the server, with the same
validation the control plane runs (shared/rules). A *.json file is read as the server reads
a PUT body, strict JSON (no trailing comma, comment or duplicate member); other files are
YAML. Problems name the file, the line and the field. A file without "policy" takes its
name from the file name (without extension).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pfs, err := loadFiles(env, files)
			if err != nil {
				return err
			}
			for _, pf := range pfs {
				fmt.Fprintf(env.Stdout, "%s: policy %s is valid (%d rule(s))\n", pf.File, pf.Name, len(pf.Policy.Rules))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "policy file, directory of *.yaml/*.yml/*.json files, or - for standard input (repeatable)")
	return cmd
}

// planned is one policy file compared with the server.
type planned struct {
	pf   policyFile
	diff *PolicyDiff
	etag string // the server's ETag when read; "" if the policy does not exist
}

// plan loads the files and diffs each against the server.
func plan(cmd *cobra.Command, g *globals, env *Env, files []string) (*client, []planned, error) {
	pfs, err := loadFiles(env, files)
	if err != nil {
		return nil, nil, err
	}
	c, err := g.client(env)
	if err != nil {
		return nil, nil, err
	}
	var out []planned
	for _, pf := range pfs {
		doc, etag, err := c.getPolicy(ctxOf(cmd), pf.Name)
		if err != nil {
			return nil, nil, err
		}
		d, err := diffPolicies(pf.Name, doc, pf.Doc)
		if err != nil {
			return nil, nil, withCode(ExitServer, err)
		}
		d.OldETag = etag
		out = append(out, planned{pf: pf, diff: d, etag: etag})
	}
	return c, out, nil
}

func diffCmd(g *globals, env *Env) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "diff -f FILE|DIR|-",
		Short: "Show what apply would change, rule by rule; exit 1 if anything differs",
		Long: `Compare policy files with the server, rule by rule: added (+), removed (-) and changed (~)
rules with each changed field as old → new. Exits 0 when the server agrees with every
file, 1 when anything differs (as kubectl diff does), so CI can gate on it.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, plans, err := plan(cmd, g, env, files)
			if err != nil {
				return err
			}
			differ := false
			for _, p := range plans {
				p.diff.print(env.Stdout)
				differ = differ || !p.diff.Empty()
			}
			if differ {
				return withCode(ExitDiff, nil)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "policy file, directory, or - for standard input (repeatable)")
	return cmd
}

func applyCmd(g *globals, env *Env) *cobra.Command {
	var files []string
	var dryRun, force bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|-",
		Short: "Make the server's policies what the files say, showing the diff first",
		Long: `Apply policy files (YAML or JSON; one policy per file). Every file is validated
offline first: if any is invalid nothing is written. For each policy the rule-level diff
against the server is printed, then the policy is written with If-Match: the ETag read for
the diff (If-None-Match: * for a new policy), so a change made by someone else in between
is reported (exit 3) and not overwritten. An unchanged policy is not written.

A file whose "version" (as "get" exports it) is older than the server's would undo the
versions in between: apply then shows the diff, writes nothing and exits 3, unless --force.
A file without "version" is applied whatever the server's.

The policy name is the document's "policy" member, or else the file name without its
extension. With --dry-run the server validates each changed policy without writing it.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, plans, err := plan(cmd, g, env, files)
			if err != nil {
				return err
			}
			var stale []string
			for _, p := range plans {
				p.diff.print(env.Stdout)
				if server := tagVersion(p.etag); !p.diff.Empty() && p.pf.Version > 0 && p.pf.Version < server {
					stale = append(stale, fmt.Sprintf("%s: policy %s was exported at v%d and the server is at v%d: applying it would undo v%d..v%d (the diff above)",
						p.pf.File, p.pf.Name, p.pf.Version, server, p.pf.Version+1, server))
				}
			}
			if len(stale) > 0 && !force {
				return withCode(ExitServer, fmt.Errorf("%s\nnothing was written: get the policy again and redo the change, or apply with --force", strings.Join(stale, "\n")))
			}
			for _, p := range plans {
				if p.diff.Empty() {
					continue
				}
				if env.beforeWrite != nil {
					env.beforeWrite(p.pf.Name)
				}
				r, err := c.putPolicy(ctxOf(cmd), p.pf.Name, p.pf.Doc, p.etag, dryRun)
				var se *serverError
				if errors.As(err, &se) && se.Status == http.StatusPreconditionFailed {
					now := "was created"
					if p.etag != "" {
						now = "changed"
					}
					return withCode(ExitServer, fmt.Errorf("policy %s %s on the server since it was read (ETag read %s, now %s); nothing was written: run diff and apply again",
						p.pf.Name, now, orDash(p.etag), orDash(se.Header.Get("ETag"))))
				}
				if err != nil {
					return err
				}
				newTag := r.Header.Get("ETag")
				switch {
				case dryRun:
					var body struct {
						Version uint64 `json:"version"`
					}
					_ = json.Unmarshal(r.Body, &body)
					fmt.Fprintf(env.Stdout, "policy %s: server dry run passed; would be v%d (nothing written)\n", p.pf.Name, body.Version)
				case p.etag == "":
					fmt.Fprintf(env.Stdout, "policy %s created (v%d)\n", p.pf.Name, tagVersion(newTag))
				default:
					fmt.Fprintf(env.Stdout, "policy %s configured (v%d → v%d)\n", p.pf.Name, tagVersion(p.etag), tagVersion(newTag))
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "policy file, directory, or - for standard input (repeatable)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate on the server (PUT ?dry_run=true) without writing")
	cmd.Flags().BoolVar(&force, "force", false, "apply files whose version is older than the server's")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func outputFlag(cmd *cobra.Command, o *string) {
	cmd.Flags().StringVarP(o, "output", "o", "table", "output format: table, yaml or json")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
}

func checkOutput(o string) error {
	switch o {
	case "table", "yaml", "json":
		return nil
	}
	return withCode(ExitUsage, fmt.Errorf("--output %q: want table, yaml or json", o))
}

// printDoc prints a JSON document as yaml or indented json.
func printDoc(env *Env, output string, doc []byte) error {
	if output == "yaml" {
		y, err := jsonToYAML(doc)
		if err != nil {
			return withCode(ExitServer, err)
		}
		_, _ = env.Stdout.Write(y)
		return nil
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, doc, "", "  "); err != nil {
		return withCode(ExitServer, err)
	}
	buf.WriteByte('\n')
	_, _ = env.Stdout.Write(buf.Bytes())
	return nil
}

// policyCompletion completes policy names from the server.
func policyCompletion(g *globals, env *Env) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := g.client(env)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, "/v1/policies", nil, false))
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var list policyList
		_ = json.Unmarshal(r.Body, &list)
		var names []string
		for _, p := range list.Policies {
			names = append(names, p.Policy)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

type policyList struct {
	Policies []struct {
		Policy  string `json:"policy"`
		Version uint64 `json:"version"`
		Rules   int    `json:"rules"`
	} `json:"policies"`
}

func getCmd(g *globals, env *Env) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get [POLICY [RULE]]",
		Short: "List policies, or show one policy or one rule",
		Args:  usageArgs(cobra.MaximumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clientWithOutput(env, output)
			if err != nil {
				return err
			}
			path := "/v1/policies"
			for _, a := range args {
				path += "/" + url.PathEscape(a)
			}
			if len(args) == 2 {
				path = "/v1/policies/" + url.PathEscape(args[0]) + "/rules/" + url.PathEscape(args[1])
			}
			r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, path, nil, false))
			if err != nil {
				return err
			}
			if len(args) > 0 {
				if _, err := c.policyETag(r, "GET "+path); err != nil {
					return err
				}
			} else if !bytes.Contains(r.Body, []byte(`"policies"`)) {
				return &foreignError{c.base, "GET /v1/policies answered without a policy list"}
			}
			if output != "table" {
				return printDoc(env, output, r.Body)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			defer tw.Flush()
			switch len(args) {
			case 0:
				var list policyList
				if err := json.Unmarshal(r.Body, &list); err != nil {
					return withCode(ExitServer, err)
				}
				fmt.Fprintln(tw, "POLICY\tVERSION\tRULES")
				for _, p := range list.Policies {
					fmt.Fprintf(tw, "%s\t%d\t%d\n", p.Policy, p.Version, p.Rules)
				}
			case 1:
				var p struct {
					Policy  string           `json:"policy"`
					Version uint64           `json:"version"`
					Rules   []map[string]any `json:"rules"`
				}
				if err := json.Unmarshal(r.Body, &p); err != nil {
					return withCode(ExitServer, err)
				}
				fmt.Fprintf(env.Stdout, "policy %s, version %d, %d rule(s)\n", p.Policy, p.Version, len(p.Rules))
				ruleTable(tw, p.Rules)
			default:
				var rule map[string]any
				if err := json.Unmarshal(r.Body, &rule); err != nil {
					return withCode(ExitServer, err)
				}
				ruleTable(tw, []map[string]any{rule})
			}
			return nil
		},
		ValidArgsFunction: policyCompletion(g, env),
	}
	outputFlag(cmd, &output)
	return cmd
}

// ruleTable prints rules one a line; MATCH is the request match, or for a
// descriptor rule its descriptor (descriptorText); SHADOW says whether the
// rule only logs.
func ruleTable(tw *tabwriter.Writer, rules []map[string]any) {
	fmt.Fprintln(tw, "RULE\tALGORITHM\tLIMIT\tWINDOW\tKEY\tMATCH\tSHADOW")
	for _, r := range rules {
		window := r["window"]
		if window == nil {
			window = r["lease"]
		}
		match := compactOrDash(r["match"])
		if d, ok := r["descriptor"].(map[string]any); ok {
			match = descriptorText(d)
		}
		shadow := "-"
		if r["shadow"] == true {
			shadow = "yes"
		}
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%s\t%s\t%s\n", r["id"], r["algorithm"], r["limit"], orEmpty(window), joinKey(r["key"]), match, shadow)
	}
}

// descriptorText is a descriptor rule's descriptor on one line:
// "descriptor <domain>: key=value,key,..." (a key alone matches any value;
// "(shared)" marks a shared wildcard), then "unlimited", "no limit" or
// "quota mode" when set.
func descriptorText(d map[string]any) string {
	var parts []string
	entries, _ := d["entries"].([]any)
	for _, e := range entries {
		m, _ := e.(map[string]any)
		p := fmt.Sprint(m["key"])
		if v, _ := m["value"].(string); v != "" {
			p += "=" + v
		}
		if m["shared"] == true {
			p += "(shared)"
		}
		parts = append(parts, p)
	}
	out := "descriptor " + fmt.Sprint(d["domain"]) + ": " + strings.Join(parts, ",")
	for _, f := range []struct{ field, say string }{{"unlimited", "unlimited"}, {"no_limit", "no limit"}, {"quota_mode", "quota mode"}} {
		if d[f.field] == true {
			out += " " + f.say
		}
	}
	return out
}

func orEmpty(v any) any {
	if v == nil {
		return "-"
	}
	return v
}

func joinKey(v any) string {
	list, _ := v.([]any)
	if len(list) == 0 {
		return "-"
	}
	parts := make([]string, len(list))
	for i, p := range list {
		parts[i] = fmt.Sprint(p)
	}
	return strings.Join(parts, ",")
}

func compactOrDash(v any) string {
	if v == nil {
		return "-"
	}
	return compact(v)
}

func historyCmd(g *globals, env *Env) *cobra.Command {
	var output string
	var version uint64
	cmd := &cobra.Command{
		Use:   "history POLICY [--version N]",
		Short: "List a policy's retained versions, newest first, or show what one changed",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clientWithOutput(env, output)
			if err != nil {
				return err
			}
			if version > 0 {
				return versionChanges(cmd, c, env, args[0], version)
			}
			r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, "/v1/policies/"+url.PathEscape(args[0])+"/versions", nil, false))
			if err != nil {
				return err
			}
			if output != "table" {
				return printDoc(env, output, r.Body)
			}
			var h struct {
				Current  uint64 `json:"current"`
				Exists   bool   `json:"exists"`
				Versions []struct {
					Version uint64    `json:"version"`
					Time    time.Time `json:"time"`
					Actor   string    `json:"actor"`
					Op      string    `json:"op"`
					Detail  string    `json:"detail"`
					Deleted bool      `json:"deleted"`
				} `json:"versions"`
			}
			if err := json.Unmarshal(r.Body, &h); err != nil {
				return withCode(ExitServer, err)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "VERSION\tTIME\tACTOR\tOP\tDETAIL")
			for _, v := range h.Versions {
				mark := ""
				if v.Version == h.Current && h.Exists {
					mark = " (current)"
				}
				detail := v.Detail
				if v.Deleted {
					detail = strings.TrimSpace(detail + " deleted")
				}
				fmt.Fprintf(tw, "%d%s\t%s\t%s\t%s\t%s\n", v.Version, mark, v.Time.UTC().Format(time.RFC3339), v.Actor, v.Op, orDashStr(detail))
			}
			return nil
		},
		ValidArgsFunction: policyCompletion(g, env),
	}
	outputFlag(cmd, &output)
	cmd.Flags().Uint64Var(&version, "version", 0, "show what version N changed, against the version before it")
	return cmd
}

// versionChanges prints what version v of policy changed: its document
// against version v-1's (GET …/versions/{version}), as diff prints a change;
// against no rules when v-1 is not retained (the first version, or one the
// history no longer keeps, said so).
func versionChanges(cmd *cobra.Command, c *client, env *Env, policy string, v uint64) error {
	path := func(n uint64) string {
		return "/v1/policies/" + url.PathEscape(policy) + "/versions/" + strconv.FormatUint(n, 10)
	}
	r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, path(v), nil, false))
	if err != nil {
		return err
	}
	prev, against := []byte(`{"rules":[]}`), "no rules"
	if v > 1 {
		p, err := accept(http.StatusOK, http.StatusNotFound)(c.do(ctxOf(cmd), http.MethodGet, path(v-1), nil, false))
		switch {
		case err != nil:
			return err
		case p.Status == http.StatusOK:
			prev, against = p.Body, fmt.Sprintf("v%d", v-1)
		default:
			against = fmt.Sprintf("no rules (v%d is not in the history)", v-1)
		}
	}
	d, err := diffPolicies(policy, prev, r.Body)
	if err != nil {
		return withCode(ExitServer, err)
	}
	fmt.Fprintf(env.Stdout, "policy %s v%d, against %s: %s\n", policy, v, against, d.counts())
	d.printChanges(env.Stdout)
	return nil
}

func orDashStr(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func rollbackCmd(g *globals, env *Env) *cobra.Command {
	var to uint64
	cmd := &cobra.Command{
		Use:   "rollback POLICY --to VERSION",
		Short: "Make an earlier version current again (as a new version)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == 0 {
				return withCode(ExitUsage, errors.New("--to VERSION is required (see sluicectl history "+args[0]+")"))
			}
			c, err := g.client(env)
			if err != nil {
				return err
			}
			body := []byte(`{"version":` + strconv.FormatUint(to, 10) + `}`)
			r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodPost, "/v1/policies/"+url.PathEscape(args[0])+"/rollback", body, true))
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "policy %s rolled back to v%d (now v%d)\n", args[0], to, tagVersion(r.Header.Get("ETag")))
			return nil
		},
		ValidArgsFunction: policyCompletion(g, env),
	}
	cmd.Flags().Uint64Var(&to, "to", 0, "the version to restore (from sluicectl history)")
	return cmd
}

func deleteCmd(g *globals, env *Env) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "delete POLICY [RULE]",
		Short: "Delete a policy, or one rule of it (asks first unless --yes)",
		Long: "Delete a policy, or one rule of it. Every proxy enforcing the policy stops\n" +
			"enforcing it (or the rule) as fast as it picks up a change. Asks for\n" +
			"confirmation on standard input unless --yes is given.",
		Args: usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(env)
			if err != nil {
				return err
			}
			path := "/v1/policies/" + url.PathEscape(args[0])
			what := "policy " + args[0] + " (every proxy enforcing it stops limiting)"
			if len(args) == 2 {
				path += "/rules/" + url.PathEscape(args[1])
				what = "rule " + args[1] + " of policy " + args[0]
			}
			if !yes {
				fmt.Fprintf(env.Stderr, "delete %s? [y/N] ", what)
				line, _ := bufio.NewReader(env.Stdin).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
					return withCode(ExitUsage, errors.New("not deleted (answer y to delete, or pass --yes)"))
				}
			}
			r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodDelete, path, nil, true))
			if err != nil {
				return err
			}
			if len(args) == 2 {
				fmt.Fprintf(env.Stdout, "rule %s deleted from policy %s (now v%d)\n", args[1], args[0], tagVersion(r.Header.Get("ETag")))
			} else {
				fmt.Fprintf(env.Stdout, "policy %s deleted\n", args[0])
			}
			return nil
		},
		ValidArgsFunction: policyCompletion(g, env),
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	return cmd
}

// jsonToYAML renders a JSON document as block-style YAML, keeping the
// order of object members (the server's document order: "policy", then
// each rule's "id" first), so that it reads like a hand-written file and
// applies back unchanged.
func jsonToYAML(doc []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(doc, &n); err != nil {
		return nil, err
	}
	var plain func(*yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0
		if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
			// Plain unless that would read as another type ("true", "5").
			var v any
			if yaml.Unmarshal([]byte(n.Value), &v) != nil || v != n.Value || strings.ContainsAny(n.Value, "\n#:") {
				n.Style = yaml.DoubleQuotedStyle
			}
		}
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	_ = enc.Close()
	return buf.Bytes(), nil
}
