package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlsimport"
	"github.com/sluice-proxy/sluice/shared/rules"
)

func importCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Turn another rate limiter's configuration into a sluice policy",
	}
	var policy string
	var merge bool
	rl := &cobra.Command{
		Use:   "ratelimit FILE... [--policy NAME] [--merge-domains]",
		Short: "Turn envoyproxy/ratelimit configuration files into a policy of descriptor rules",
		Long: `Read envoyproxy/ratelimit configuration files (YAML, as that service loads them;
several files and domains) and print one sluice policy on standard output: a fixed_window
rule of scope fleet per descriptor with a rate_limit, served by the control plane's
RateLimitService to Envoy's ratelimit filter; unlimited, replaces, a limit of 0, a value
without a rate_limit (no limit), share_threshold, quota_mode and shadow_mode as there.
A domain in two files is refused unless --merge-domains (envoyproxy/ratelimit's
MERGE_DOMAIN_CONFIG); what that service refuses is refused with the file, line and
field; fields that only name metrics are accepted and noted on standard error. The
policy is named after the domain unless --policy names it. Apply the result with
sluicectl apply -f.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(_ *cobra.Command, args []string) error {
			var files []rlsimport.File
			for _, name := range args {
				data, err := os.ReadFile(name)
				if err != nil {
					return withCode(ExitUsage, err)
				}
				files = append(files, rlsimport.File{Name: name, Data: data})
			}
			name := policy
			if name == "" {
				name = "import" // renamed after the domain below
			}
			res, err := rlsimport.Import(name, files, rlsimport.Options{MergeDomains: merge})
			if err != nil {
				return withCode(ExitUsage, err)
			}
			if policy == "" {
				if res.Policy.Name, err = policyOfDomain(res.Policy); err != nil {
					return withCode(ExitUsage, err)
				}
			}
			for _, n := range res.Notes {
				fmt.Fprintln(env.Stderr, "note:", n)
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, rules.EncodePolicy(res.Policy), "", "  "); err != nil {
				return err
			}
			buf.WriteByte('\n')
			_, err = env.Stdout.Write(buf.Bytes())
			return err
		},
	}
	rl.Flags().StringVar(&policy, "policy", "", "name of the policy written (default: the files' domain, when they have one that is a valid policy name)")
	rl.Flags().BoolVar(&merge, "merge-domains", false, "merge files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain in a second file is refused")
	cmd.AddCommand(rl)
	return cmd
}

// policyOfDomain is the name of an imported policy without --policy: its
// rules' one domain. Errors: several domains, or a domain that is no policy
// name (a URL path segment, rules.ValidName).
func policyOfDomain(p *rules.Policy) (string, error) {
	var domains []string
	for _, r := range p.Rules {
		if r.Descriptor != nil && !slices.Contains(domains, r.Descriptor.Domain) {
			domains = append(domains, r.Descriptor.Domain)
		}
	}
	switch {
	case len(domains) == 1 && rules.ValidName(domains[0]):
		return domains[0], nil
	case len(domains) == 1:
		return "", fmt.Errorf("the domain %q is not a policy name (1 to 63 of a-z, 0-9, '_', '.', '-'): name the policy with --policy", domains[0])
	case len(domains) == 0:
		return "", errors.New("no rate limits in the files: name the policy with --policy")
	}
	return "", fmt.Errorf("the files have %d domains (%s): name the policy with --policy", len(domains), strings.Join(domains, ", "))
}
