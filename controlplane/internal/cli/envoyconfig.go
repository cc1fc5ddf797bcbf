package cli

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlqs"
	"github.com/sluice-proxy/sluice/shared/rules"
)

func envoyConfigCmd(g *globals, env *Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "envoy-config",
		Short: "Generate Envoy configuration for a policy",
	}
	var policy, file string
	var o rlqs.ConfigOptions
	cmd := &cobra.Command{
		Use:   "rlqs --policy NAME [-f FILE]",
		Short: "An Envoy bootstrap whose native rate_limit_quota filter enforces the policy's fleet rules",
		Long: `Print an Envoy bootstrap (YAML) that enforces the fleet rules of a policy with Envoy's
own rate_limit_quota filter, served by the control plane's Rate Limit Quota Service
(sluice-controlplane --grpc-listen): one bucket matcher per fleet rule, in policy order,
whose bucket ids name the policy, the rule and its key parts, so these Envoys and Envoys
running the sluice Wasm filter spend one budget. Rules the filter cannot enforce are left
out, each with a NOTE in the header and on standard error. The policy is read from the
server, or from -f FILE. The quota token, if $SLUICE_QUOTA_TOKEN is set, is sent as
"authorization: Bearer" metadata. Run it again after a policy change. See docs/rlqs.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var p *rules.Policy
			switch {
			case file != "":
				pfs, err := loadFiles(env, []string{file})
				if err != nil {
					return err
				}
				if len(pfs) != 1 {
					return withCode(ExitUsage, errors.New("-f: give one policy file"))
				}
				p = pfs[0].Policy
			case policy != "":
				c, err := g.client(env)
				if err != nil {
					return err
				}
				path := "/v1/policies/" + url.PathEscape(policy)
				r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, path, nil, false))
				if err != nil {
					return err
				}
				if p, err = rules.ParsePolicy(r.Body); err != nil {
					return withCode(ExitServer, fmt.Errorf("GET %s: %w", path, err))
				}
			default:
				return withCode(ExitUsage, errors.New("give --policy NAME (read from the server) or -f FILE"))
			}
			o.Token = env.Getenv("SLUICE_QUOTA_TOKEN")
			doc, notes, err := rlqs.EnvoyConfig(p, o)
			for _, n := range notes {
				fmt.Fprintln(env.Stderr, "sluicectl: NOTE:", n)
			}
			if err != nil {
				return withCode(ExitUsage, err)
			}
			_, err = env.Stdout.Write(doc)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&policy, "policy", "", "the policy to read from the server")
	f.StringVarP(&file, "filename", "f", "", "read the policy from this file (YAML or JSON) instead")
	f.StringVar(&o.Env, "env", "default", "the env of the counter keys: the filter's domain")
	f.StringVar(&o.ControlPlane, "grpc", "127.0.0.1:8081", "the control plane's --grpc-listen address, host:port")
	f.StringVar(&o.Upstream, "upstream", "127.0.0.1:8000", "the service's address, host:port")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:10000", "the listener's address, host:port")
	f.DurationVar(&o.ReportingInterval, "reporting-interval", time.Second, "each bucket's reporting_interval (more than 100ms)")
	root.AddCommand(cmd)
	return root
}
