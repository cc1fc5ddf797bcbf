package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-proxy/sluice/controlplane/internal/lab"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// replayFlags are replay's flags.
type replayFlags struct {
	policyFile, wasm, output, plot string
	logs, fields                   []string
	envoys, workers, top           int
	env                            string
	reorder                        time.Duration
}

func replayCmd(env *Env) *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay --policy FILE --log ACCESS_LOG...",
		Short: "Replay an Envoy access log against a candidate policy, offline",
		Long: `Replay the requests of Envoy access logs (the JSON format envoy/envoy.yaml writes:
timestamp, method, path, user_id, tenant_id, client_ip and the logged rate_limit) through
the real filter module running the candidate policy, in timestamp order, on a virtual
clock that follows the log. Logs of several Envoys may be given as several --log or
concatenated. With --envoys N the requests are dealt to N simulated Envoys in turn: rules
of scope "envoy" count per Envoy, fleet rules hold their limit across all of them (an
in-process quota service). The same input gives the same output. See docs/lab.md.

Per rule: requests matched, allowed, denied, the first denial and the keys denied most;
against the decisions in the log: requests the candidate denies that were allowed, and
the reverse.

Exit codes: 0 done; 2 a file or flag is invalid; 3 the filter failed.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(ctxOf(cmd), env) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policyFile, "policy", "", "the candidate policy file (as apply takes it)")
	fl.StringArrayVar(&f.logs, "log", nil, "access log file, JSON lines (repeatable; logs of several Envoys may also be concatenated)")
	fl.StringArrayVar(&f.fields, "field", nil, "read request header from a log member: header=log_field (repeatable; the policy's identity headers come from user_id and tenant_id unless given)")
	fl.StringVar(&f.env, "env", "", "the env of the counter keys (the filter's env; default: the env member of the log's first line, else default)")
	fl.IntVar(&f.envoys, "envoys", 1, "deal the requests to this many Envoys in turn: envoy-scoped rules count per Envoy (1: the whole log as one Envoy)")
	fl.IntVar(&f.workers, "workers", 1, "worker VMs per Envoy (Envoy's --concurrency)")
	fl.IntVar(&f.top, "top", 10, "keys listed per rule, by denials")
	fl.DurationVar(&f.reorder, "reorder", time.Minute, "how far out of order the lines of one log may be (Envoy logs a request when it ends)")
	fl.StringVar(&f.wasm, "wasm", "", "filter module to run (default: the one built into sluicectl)")
	fl.StringVar(&f.plot, "plot", "", "also draw allowed and denied per minute per rule into this SVG file")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	return cmd
}

// check refuses flags out of range before anything runs, the --plot path
// included (a run may be long).
func (f *replayFlags) check() error {
	if f.output != "table" && f.output != "json" {
		return withCode(ExitUsage, fmt.Errorf("-o %q: want table or json", f.output))
	}
	if f.policyFile == "" || len(f.logs) == 0 {
		return withCode(ExitUsage, fmt.Errorf("--policy and --log are required"))
	}
	if f.env != "" && !rules.ValidName(f.env) {
		return withCode(ExitUsage, fmt.Errorf("--env %q: not a valid env name (1 to 63 bytes of [a-z0-9_.-] starting with [a-z0-9])", f.env))
	}
	if f.envoys < 1 || f.envoys > 1024 {
		return withCode(ExitUsage, fmt.Errorf("--envoys %d: want 1..1024", f.envoys))
	}
	if f.workers < 1 || f.workers > 64 {
		return withCode(ExitUsage, fmt.Errorf("--workers %d: want 1..64", f.workers))
	}
	if f.plot != "" {
		return checkWritable("--plot", f.plot)
	}
	return nil
}

// fieldMap is which log member each request header is read from: the
// policy's identity headers from user_id and tenant_id, and every --field.
func (f *replayFlags) fieldMap(pol *rules.Policy) (map[string]string, error) {
	fm := lab.DefaultFields(pol.Identity.UserHeader, pol.Identity.TenantHeader)
	for _, fd := range f.fields {
		h, member, ok := strings.Cut(fd, "=")
		if !ok || h == "" || member == "" || strings.ContainsAny(h, " \t:") {
			return nil, withCode(ExitUsage, fmt.Errorf("--field %q: want header=log_field, such as x-api-key=api_key", fd))
		}
		fm[strings.ToLower(h)] = member
	}
	return fm, nil
}

// run replays the logs and writes the report (and the plot).
func (f *replayFlags) run(ctx context.Context, env *Env) error {
	if err := f.check(); err != nil {
		return err
	}
	pfs, err := loadFiles(env, []string{f.policyFile})
	if err != nil {
		return err
	}
	pol := pfs[0].Policy
	fm, err := f.fieldMap(pol)
	if err != nil {
		return err
	}
	bin, _, err := lab.Module(f.wasm)
	if err != nil {
		return withCode(ExitUsage, err)
	}
	lab.CacheCompiled()
	lr, err := lab.ReadLog(f.logs, fm, f.reorder)
	if err != nil {
		return withCode(ExitUsage, err)
	}
	defer lr.Close()
	rep, err := f.replay(ctx, env, bin, pol, lr)
	if err != nil {
		return withCode(ExitServer, err)
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(env.Stderr, "replay: skipped %d line(s) that are not requests; the first: %s\n", rep.Skipped, rep.FirstSkip)
	}
	if f.plot != "" {
		if err := writeFileAtomic(f.plot, replaySVG(rep)); err != nil {
			return withCode(ExitUsage, err)
		}
	}
	if f.output == "json" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(env.Stdout, "%s\n", b)
		return err
	}
	printReplay(env.Stdout, rep)
	return nil
}

// replay runs lab.Replay, showing its progress on standard error once a
// second.
func (f *replayFlags) replay(ctx context.Context, env *Env, bin []byte, pol *rules.Policy, lr *lab.LogReader) (*lab.Report, error) {
	began := time.Now()
	last := began
	rep, err := lab.Replay(ctx, bin, pol, lr, lab.ReplayOptions{Envoys: f.envoys, Workers: f.workers, TopKeys: f.top, Env: f.env,
		Progress: func(n int64) {
			if now := time.Now(); now.Sub(last) >= time.Second {
				last = now
				fmt.Fprintf(env.Stderr, "replay: %d requests, %.0f a second\r", n, float64(n)/now.Sub(began).Seconds())
			}
		}})
	if last != began {
		fmt.Fprintln(env.Stderr)
	}
	return rep, err
}

// printReplay writes the report as tables for people.
func printReplay(w io.Writer, rep *lab.Report) {
	if rep.Requests == 0 {
		fmt.Fprintln(w, "no requests in the log")
		return
	}
	mode := "as one Envoy"
	if rep.Envoys > 1 {
		mode = fmt.Sprintf("dealt to %d Envoys in turn; envoy-scoped rules count per Envoy", rep.Envoys)
	}
	fmt.Fprintf(w, "%d requests from %s to %s (%s)\n", rep.Requests, rep.From.UTC().Format(time.RFC3339), rep.To.UTC().Format(time.RFC3339), mode)
	fmt.Fprintf(w, "candidate: %d allowed, %d denied\n", rep.Allowed, rep.Denied)
	if rep.Logged.Compared > 0 {
		fmt.Fprintf(w, "against the log (%d requests with a logged decision): %d newly denied, %d newly allowed\n",
			rep.Logged.Compared, rep.Logged.NewlyDenied, rep.Logged.NewlyAllowed)
	}
	if rep.Overflows > 0 {
		fmt.Fprintf(w, "warning: %d decisions were made against a full counter table (sluice.bucket_overflow): the log has more live keys than the filter's tables hold\n", rep.Overflows)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tSCOPE\tMATCHED\tALLOWED\tDENIED\tFIRST DENIAL\tNEWLY DENIED\tNEWLY ALLOWED")
	for _, r := range rep.Rules {
		denied := fmt.Sprint(r.Denied)
		if r.Shadow {
			denied = fmt.Sprintf("(shadow) %d", r.ShadowDenied)
		}
		first := "-"
		if r.FirstDenial != nil {
			first = r.FirstDenial.UTC().Format(time.RFC3339Nano)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\n", r.ID, r.Scope, r.Matched, r.Allowed, denied, first, r.NewlyDenied, r.NewlyAllowed)
	}
	tw.Flush()
	header := false
	for _, r := range rep.Rules {
		if len(r.TopKeys) == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nkeys denied most:")
			header = true
		}
		for _, k := range r.TopKeys {
			fmt.Fprintf(w, "  %s  %d  %s\n", r.ID, k.Denied, k.Key)
		}
	}
}

// replaySVG draws, per rule, allowed (green) and denied (red) requests per
// minute over the log's span: one panel per rule, a shared time axis.
func replaySVG(rep *lab.Report) []byte {
	const width, panelH, left, right, top = 900, 120, 60, 20, 30
	minutes := 1
	for _, r := range rep.Rules {
		if n := len(r.PerMinute); n > 0 {
			minutes = max(minutes, r.PerMinute[n-1].Minute+1)
		}
	}
	// One point per column at most: a long log's minutes are summed per column.
	cols := min(minutes, width-left-right)
	height := top + len(rep.Rules)*(panelH+30) + 24
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	unit := "minute"
	if cols < minutes {
		unit = strconv.Itoa((minutes+cols-1)/cols) + " minutes"
	}
	fmt.Fprintf(&b, `<text x="%d" y="18">requests per %s from %s (%d minutes): allowed in green, denied in red</text>`+"\n",
		left, unit, rep.From.UTC().Format(time.RFC3339), minutes)
	plotW := float64(width - left - right)
	for i, r := range rep.Rules {
		y0 := top + i*(panelH+30)
		sum := make([]lab.MinuteCount, cols)
		for _, m := range r.PerMinute {
			c := &sum[m.Minute*cols/minutes]
			c.Allowed += m.Allowed
			c.Denied += m.Denied
		}
		var peak int64 = 1
		for _, m := range sum {
			peak = max(peak, m.Allowed, m.Denied)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (%s)</text>`+"\n", left, y0+12, html.EscapeString(r.ID), r.Scope)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, y0+18, plotW, panelH-18)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%d</text>`+"\n", left-4, y0+28, peak)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">0</text>`+"\n", left-4, y0+panelH)
		for _, s := range []struct {
			color string
			get   func(lab.MinuteCount) int64
		}{{"#2a9d3a", func(m lab.MinuteCount) int64 { return m.Allowed }}, {"#d62728", func(m lab.MinuteCount) int64 { return m.Denied }}} {
			var pts strings.Builder
			for m := range cols {
				v := s.get(sum[m])
				x := float64(left) + plotW*(float64(m)+0.5)/float64(cols)
				y := float64(y0+panelH) - float64(panelH-18)*float64(v)/float64(peak)
				fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", s.color, strings.TrimSpace(pts.String()))
		}
	}
	// The time axis under the last panel: the first minute, the middle, the last.
	axisY := top + len(rep.Rules)*(panelH+30) + 4
	start := rep.From.UTC().Truncate(time.Minute)
	for _, m := range []int{0, minutes / 2, minutes} {
		anchor := map[int]string{0: "start", minutes: "end"}[m]
		if anchor == "" {
			anchor = "middle"
		}
		x := float64(left) + plotW*float64(m)/float64(minutes)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="%s">%s</text>`+"\n", x, axisY, anchor,
			start.Add(time.Duration(m)*time.Minute).Format("2006-01-02 15:04"))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
