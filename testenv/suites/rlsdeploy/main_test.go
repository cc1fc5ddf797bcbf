// Package rlsdeploy runs a Deployment written for envoyproxy/ratelimit (its
// environment variables, its configuration files mounted as a Kubernetes
// ConfigMap volume, its three listeners) twice: once with envoyproxy/ratelimit
// itself (built from the Go module proxy, ratelimitpeer), once with sluice's
// image command /bin/ratelimit (sluice-controlplane run under the name
// "ratelimit"), each on a Redis of its own, and checks that both do what the
// Deployment expects. Every check passing against envoyproxy/ratelimit shows
// the harness is right.
package rlsdeploy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// readyTimeout bounds how long a service may take to answer /healthcheck;
// changeTimeout how long a changed ConfigMap may take to be served.
const (
	readyTimeout  = 30 * time.Second
	changeTimeout = 15 * time.Second
)

var binDir string // sluice-controlplane, sluicectl, and ratelimit: a symbolic link to sluice-controlplane

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/sluicectl"},
		func(dir, _ string) error {
			binDir = dir
			return os.Symlink(filepath.Join(dir, "sluice-controlplane"), filepath.Join(dir, "ratelimit"))
		})
}
