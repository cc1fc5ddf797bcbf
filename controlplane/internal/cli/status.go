package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// policyStatus is the body of GET /v1/policies/{policy}/status.
type policyStatus struct {
	Policy            string  `json:"policy"`
	Exists            bool    `json:"exists"`
	Version           uint64  `json:"version"`
	ETag              string  `json:"etag"`
	StaleAfterSeconds float64 `json:"stale_after_seconds"`
	Synced            int     `json:"synced"`
	Stale             int     `json:"stale"`
	Envoys            []struct {
		Node       string  `json:"node"`
		Status     string  `json:"status"`
		ETag       string  `json:"etag"`
		Version    uint64  `json:"version"`
		Build      string  `json:"build"`
		Address    string  `json:"address"`
		AgeSeconds float64 `json:"age_seconds"`
		Polling    bool    `json:"polling"`
	} `json:"envoys"`
	RLS *struct {
		Decisions  int64   `json:"decisions"`
		AgeSeconds float64 `json:"age_seconds"`
	} `json:"rls"`
}

func statusCmd(g *globals, env *Env) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status [POLICY]",
		Short: "Show every Envoy enforcing a policy, the version it runs and whether it is in sync",
		Long: `Like istioctl proxy-status: for each Envoy whose filter polls the policy, the version it
runs, when it last polled, and
  SYNCED    it runs the current version and is polling now or polled recently
  STALE     it runs another version, or has not polled for longer than the server's
            --envoy-stale-after (default its --max-wait + 15s)
  NOT SEEN  no Envoy polls the policy
and, when the replica's RateLimitService has decided descriptors under the policy's rules
(Envoys using their ratelimit filter do not poll), a line "rls" SERVING with how many and
when the last was. Without POLICY, every policy. The control plane keeps this in memory per replica: with
several replicas behind one address, each answer covers the Envoys polling the replica
that answered. Exits 1 unless every Envoy of every policy shown is SYNCED and each policy is polled
or served over the RateLimitService.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clientWithOutput(env, output)
			if err != nil {
				return err
			}
			names := args
			if len(names) == 0 {
				r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, "/v1/policies", nil, false))
				if err != nil {
					return err
				}
				var list policyList
				if err := json.Unmarshal(r.Body, &list); err != nil {
					return withCode(ExitServer, err)
				}
				for _, p := range list.Policies {
					names = append(names, p.Policy)
				}
			}
			var all []policyStatus
			var raw []json.RawMessage
			for _, n := range names {
				r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, "/v1/policies/"+url.PathEscape(n)+"/status", nil, false))
				if err != nil {
					return err
				}
				var st policyStatus
				if err := json.Unmarshal(r.Body, &st); err != nil {
					return withCode(ExitServer, err)
				}
				all = append(all, st)
				raw = append(raw, r.Body)
			}
			allSynced := true
			for _, st := range all {
				if len(st.Envoys) == 0 && st.RLS == nil || st.Stale > 0 {
					allSynced = false
				}
			}
			switch output {
			case "table":
				tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NODE\tPOLICY\tVERSION\tCURRENT\tSTATUS\tLAST SEEN\tBUILD\tADDRESS")
				for _, st := range all {
					cur := "-"
					if st.Exists {
						cur = fmt.Sprintf("v%d", st.Version)
					}
					if len(st.Envoys) == 0 && st.RLS == nil {
						fmt.Fprintf(tw, "-\t%s\t-\t%s\tNOT SEEN\t-\t-\t-\n", st.Policy, cur)
					}
					if r := st.RLS; r != nil {
						fmt.Fprintf(tw, "rls (this replica)\t%s\t%s\t%s\tSERVING\t%s ago\t-\t%d descriptors decided\n", st.Policy, cur, cur,
							age(time.Duration(r.AgeSeconds*float64(time.Second))), r.Decisions)
					}
					for _, e := range st.Envoys {
						ver := "-"
						if e.ETag != "" {
							ver = fmt.Sprintf("v%d", e.Version)
						}
						seen := "polling"
						if !e.Polling {
							seen = age(time.Duration(e.AgeSeconds*float64(time.Second))) + " ago"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Node, st.Policy, ver, cur, e.Status, seen, orDashStr(e.Build), orDashStr(e.Address))
					}
				}
				tw.Flush()
			default:
				doc, _ := json.Marshal(raw)
				if len(args) == 1 {
					doc = raw[0]
				}
				if err := printDoc(env, output, doc); err != nil {
					return err
				}
			}
			if !allSynced {
				return withCode(ExitDiff, nil)
			}
			return nil
		},
		ValidArgsFunction: policyCompletion(g, env),
	}
	outputFlag(cmd, &output)
	return cmd
}
