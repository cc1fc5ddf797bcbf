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
	"runtime/debug"

	"github.com/sluice-proxy/sluice/controlplane/internal/app"
)

// gcPercent is the garbage collector's target (GOGC) when the environment sets
// none: a collection starts when the heap has grown by twice what the last
// one left live, where Go's default is once. docs/operations.md, "Garbage
// collection".
const gcPercent = 200

// tuneGC sets the garbage collector's target to gcPercent unless lookup (the
// environment's) has GOGC, which the Go runtime has then applied.
func tuneGC(lookup func(string) (string, bool)) {
	if _, ok := lookup("GOGC"); !ok {
		debug.SetGCPercent(gcPercent)
	}
}

func main() {
	tuneGC(os.LookupEnv)
	if filepath.Base(os.Args[0]) == "ratelimit" || len(os.Args) > 1 && os.Args[1] == "ratelimit" {
		os.Exit(app.MainRateLimit(os.Stderr))
	}
	os.Exit(app.Main(os.Args[1:], os.Getenv, os.Stderr))
}
