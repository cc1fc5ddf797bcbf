// Package cli is sluicectl, the command-line client of the sluice control
// plane: declarative apply with a rule-level diff, history, rollback,
// validation and the rollout status of every Envoy, over the REST API only
// (controlplane/openapi.yaml).
//
// # Exit codes
//
//	0  success (for diff: no difference; for status: every Envoy SYNCED)
//	1  diff found a difference; status found an Envoy not SYNCED (or none)
//	2  usage error, or a file or request the validation refused
//	3  server or network error: unreachable, 5xx, refused (401, 403, 404),
//	   or a concurrent change (412: the policy changed since it was read)
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-proxy/sluice/controlplane/version"
)

// Exit codes of Main.
const (
	ExitOK     = 0
	ExitDiff   = 1
	ExitUsage  = 2
	ExitServer = 3
)

// DefaultServer is the control plane's address when neither --server nor
// SLUICE_SERVER is set.
const DefaultServer = "http://127.0.0.1:8080"

// exitError carries an exit code; a nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// Env is what Main needs from the process.
type Env struct {
	// Stdin is read by -f -; nil means os.Stdin.
	Stdin io.Reader
	// Stdout receives results, Stderr errors (both required).
	Stdout, Stderr io.Writer
	// Getenv reads SLUICE_SERVER, SLUICE_ADMIN_TOKEN, SLUICE_READ_TOKEN
	// and USER; nil means os.Getenv.
	Getenv func(string) string
	// beforeWrite, if set, runs between apply's read of a policy and its
	// write (tests use it to change the policy concurrently).
	beforeWrite func(policy string)
}

// Main runs sluicectl with args (without the program name) and returns
// the exit code.
func Main(args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	if env.Stdin == nil {
		env.Stdin = os.Stdin
	}
	root := newRoot(&env)
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	var se *serverError
	var ne *networkError
	var fe *foreignError
	switch {
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(env.Stderr, "sluicectl:", ee.err)
		}
		return ee.code
	case errors.As(err, &se):
		fmt.Fprintln(env.Stderr, "sluicectl:", se)
		return se.exitCode()
	case errors.As(err, &ne):
		fmt.Fprintln(env.Stderr, "sluicectl:", ne)
		return ExitServer
	case errors.As(err, &fe):
		fmt.Fprintln(env.Stderr, "sluicectl:", fe)
		return ExitServer
	}
	// cobra's own errors: unknown command or flag, wrong arguments.
	fmt.Fprintln(env.Stderr, "sluicectl:", err)
	fmt.Fprintln(env.Stderr, "Run 'sluicectl --help' for usage.")
	return ExitUsage
}

type globals struct {
	server, token, readToken, actor string
	timeout                         time.Duration
}

// clientWithOutput checks the -o value output, then returns g.client(env).
func (g *globals) clientWithOutput(env *Env, output string) (*client, error) {
	if err := checkOutput(output); err != nil {
		return nil, err
	}
	return g.client(env)
}

// client returns a REST client for --server with the tokens from the flags,
// else SLUICE_ADMIN_TOKEN and SLUICE_READ_TOKEN; a server that is not an
// http(s) URL is a usage error.
func (g *globals) client(env *Env) (*client, error) {
	if g.token == "" {
		g.token = env.Getenv("SLUICE_ADMIN_TOKEN")
	}
	if g.readToken == "" {
		g.readToken = env.Getenv("SLUICE_READ_TOKEN")
	}
	base := strings.TrimRight(g.server, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, withCode(ExitUsage, fmt.Errorf("--server %q: want an http:// or https:// URL", g.server))
	}
	return &client{base: base, adminTok: g.token, readTok: g.readToken, actor: g.actor,
		http: &http.Client{Timeout: g.timeout}, warn: env.Stderr}, nil
}

func newRoot(env *Env) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "sluicectl",
		Short: "Manage sluice rate-limit policies and see their rollout to every Envoy",
		Long: `sluicectl manages the policies of a sluice control plane through its REST API:
apply files declaratively with a rule-level diff, compare them in CI, read the history,
roll back, and see which version every Envoy runs.

Exit codes: 0 ok; 1 diff found a difference or status found an Envoy not SYNCED;
2 usage or validation error; 3 server or network error (including a policy changed
concurrently between read and write).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String(),
	}
	root.SetVersionTemplate("sluicectl {{.Version}}\n")
	server := env.Getenv("SLUICE_SERVER")
	if server == "" {
		server = DefaultServer
	}
	actor := "sluicectl"
	if u := env.Getenv("USER"); u != "" {
		actor = "sluicectl:" + u
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", server, "control plane URL (env SLUICE_SERVER)")
	// Tokens from the environment are read after parsing, so that help
	// never prints them as defaults.
	pf.StringVar(&g.token, "token", "", "admin bearer token, for writes (default $SLUICE_ADMIN_TOKEN; the flag is visible in ps)")
	pf.StringVar(&g.readToken, "read-token", "", "read bearer token, for reads (default $SLUICE_READ_TOKEN, else the admin token)")
	pf.StringVar(&g.actor, "actor", actor, "who makes the change, recorded in the history (X-Sluice-Actor)")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "timeout of each request")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(ExitUsage, err) })
	root.AddCommand(applyCmd(g, env), diffCmd(g, env), validateCmd(env), getCmd(g, env), historyCmd(g, env),
		rollbackCmd(g, env), deleteCmd(g, env), statusCmd(g, env), envoyConfigCmd(g, env), labTestCmd(env), replayCmd(env), importCmd(env))
	return root
}

// usageArgs wraps a cobra argument check so that its error exits 2.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return withCode(ExitUsage, err)
		}
		return nil
	}
}

func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
