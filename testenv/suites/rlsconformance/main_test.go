// Package rlsconformance sends the same RateLimitService calls to
// envoyproxy/ratelimit and to sluice's RateLimitService, each configured from
// envoyproxy/ratelimit's own test configurations (read from its module in the
// Go module cache, never copied here), each on a Redis of its own, and compares
// every answer. The peer is built from the Go module proxy (ratelimitpeer).
package rlsconformance

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
	"github.com/sluice-proxy/sluice/testenv/testkit/ratelimitpeer"
)

const (
	adminToken = "rlsconformance-admin-token"
	quotaToken = "rlsconformance-quota-token"
	// readyTimeout bounds how long a process may take to serve.
	readyTimeout = 30 * time.Second
)

var (
	binDir string // sluice-controlplane, sluicectl
	repo   string // the repository root
)

func TestMain(m *testing.M) {
	proctest.MainWithBinaries(m, []string{"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/sluicectl"},
		func(dir, root string) error {
			binDir, repo = dir, root
			return nil
		})
}

// peer builds envoyproxy/ratelimit's service (ratelimitpeer) and returns the
// binary and the module's directory.
func peer(t *testing.T) (bin, dir string) {
	t.Helper()
	return ratelimitpeer.Build(t, binDir)
}
