// Command sluice-controlplane serves sluice policies over REST from Redis or
// an embedded store. Run it with -h for its flags; each flag --name also
// reads the environment variable SLUICE_NAME.
//
// "sluice-controlplane ratelimit", or the binary run under the name
// "ratelimit" (the image's /bin/ratelimit), is instead envoyproxy/ratelimit's
// service, configured by envoyproxy/ratelimit's environment variables; see
// docs/ratelimit-image.md.
package main

import (
	"os"
	"path/filepath"

	"github.com/sluice-proxy/sluice/controlplane/internal/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "ratelimit" || len(os.Args) > 1 && os.Args[1] == "ratelimit" {
		os.Exit(app.MainRateLimit(os.Stderr))
	}
	os.Exit(app.Main(os.Args[1:], os.Getenv, os.Stderr))
}
