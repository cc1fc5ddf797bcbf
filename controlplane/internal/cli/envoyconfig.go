package cli

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-proxy/sluice/controlplane/internal/rlqs"
	"github.com/sluice-proxy/sluice/controlplane/internal/rls"
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
			p, err := policyFor(cmd, g, env, policy, file)
			if err != nil {
				return err
			}
			o.Token = env.Getenv("SLUICE_QUOTA_TOKEN")
			return writeEnvoyConfig(env)(rlqs.EnvoyConfig(p, o))
		},
	}
	f := cmd.Flags()
	envoyConfigFlags(f, &policy, &file, &o.ControlPlane, &o.Upstream, &o.Listen, &o.Admin)
	f.StringVar(&o.Env, "env", "default", "the env of the counter keys: the filter's domain")
	f.DurationVar(&o.ReportingInterval, "reporting-interval", time.Second, "each bucket's reporting_interval (more than 100ms)")
	root.AddCommand(cmd, rlsConfigCmd(g, env))
	return root
}

func rlsConfigCmd(g *globals, env *Env) *cobra.Command {
	var policy, file string
	var o rls.ConfigOptions
	cmd := &cobra.Command{
		Use:   "rls --policy NAME [-f FILE] [--domain DOMAIN]",
		Short: "An Envoy bootstrap whose ratelimit filter asks the control plane's RateLimitService",
		Long: `Print an Envoy bootstrap (YAML) whose envoy.filters.http.ratelimit filter asks the control
plane's RateLimitService (sluice-controlplane --grpc-listen) about the descriptor rules of one
domain of a policy: one route rate_limits entry per rule, whose actions produce its descriptor
(an exact value as a generic_key, remote_address, source_cluster and destination_cluster as
those actions, any other entry from the request header of its name), failing open and with the
draft-03 X-RateLimit headers. The policy is read from the server, or from -f FILE. The quota
token, if $SLUICE_QUOTA_TOKEN is set, is sent as "authorization: Bearer" metadata. See docs/rls.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := policyFor(cmd, g, env, policy, file)
			if err != nil {
				return err
			}
			o.Token = env.Getenv("SLUICE_QUOTA_TOKEN")
			return writeEnvoyConfig(env)(rls.EnvoyConfig(p, o))
		},
	}
	f := cmd.Flags()
	envoyConfigFlags(f, &policy, &file, &o.ControlPlane, &o.Upstream, &o.Listen, &o.Admin)
	f.StringVar(&o.Domain, "domain", "", "the rate limit domain (default: the policy's only one)")
	f.DurationVar(&o.Timeout, "timeout", 100*time.Millisecond, "the filter's timeout of a call")
	return cmd
}

// envoyConfigFlags adds the flags every envoy-config command has: where the
// policy comes from and the four addresses of the bootstrap.
func envoyConfigFlags(f *pflag.FlagSet, policy, file, grpc, upstream, listen, admin *string) {
	f.StringVar(policy, "policy", "", "the policy to read from the server")
	f.StringVarP(file, "filename", "f", "", "read the policy from this file (YAML or JSON) instead")
	f.StringVar(grpc, "grpc", "127.0.0.1:8081", "the control plane's --grpc-listen address, host:port")
	f.StringVar(upstream, "upstream", "127.0.0.1:8000", "the service's address, host:port")
	f.StringVar(listen, "listen", "127.0.0.1:10000", "the listener's address, host:port")
	f.StringVar(admin, "admin", "127.0.0.1:9901", "the admin endpoint's address, host:port (make run's Envoys take 9901 and 9902; its ratelimit-filter Envoy 9903)")
}

// writeEnvoyConfig returns the end of an envoy-config command: its notes on
// standard error, then its error (exit 2) or the document on standard output.
func writeEnvoyConfig(env *Env) func(doc []byte, notes []string, err error) error {
	return func(doc []byte, notes []string, err error) error {
		for _, n := range notes {
			fmt.Fprintln(env.Stderr, "sluicectl: NOTE:", n)
		}
		if err != nil {
			return withCode(ExitUsage, err)
		}
		_, err = env.Stdout.Write(doc)
		return err
	}
}

// policyFor reads the policy from file, or the server's current one of name.
func policyFor(cmd *cobra.Command, g *globals, env *Env, name, file string) (*rules.Policy, error) {
	switch {
	case file != "":
		pfs, err := loadFiles(env, []string{file})
		if err != nil {
			return nil, err
		}
		if len(pfs) != 1 {
			return nil, withCode(ExitUsage, errors.New("-f: give one policy file"))
		}
		return pfs[0].Policy, nil
	case name != "":
		c, err := g.client(env)
		if err != nil {
			return nil, err
		}
		path := "/v1/policies/" + url.PathEscape(name)
		r, err := accept(http.StatusOK)(c.do(ctxOf(cmd), http.MethodGet, path, nil, false))
		if err != nil {
			return nil, err
		}
		p, err := rules.ParsePolicy(r.Body)
		if err != nil {
			return nil, withCode(ExitServer, fmt.Errorf("GET %s: %w", path, err))
		}
		return p, nil
	}
	return nil, withCode(ExitUsage, errors.New("give --policy NAME (read from the server) or -f FILE"))
}
