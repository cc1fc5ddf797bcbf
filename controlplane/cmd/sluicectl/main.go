// Command sluicectl manages sluice policies through the control plane's REST
// API: apply, diff, validate, get, history, rollback, delete, and the rollout
// status of every Envoy. Run it with --help; exit codes are documented there
// and in package cli.
package main

import (
	"os"

	"github.com/sluice-proxy/sluice/controlplane/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}))
}
