// Command sluice-controlplane serves sluice policies over REST from Redis or
// an embedded store. Run it with -h for its flags; each flag --name also
// reads the environment variable SLUICE_NAME.
package main

import (
	"os"

	"github.com/sluice-proxy/sluice/controlplane/internal/app"
)

func main() { os.Exit(app.Main(os.Args[1:], os.Getenv, os.Stderr)) }
