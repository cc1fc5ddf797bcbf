package proctest

import (
	"regexp"
	"strconv"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// versionInUse matches the filter's info line when a worker takes up a
// policy version: "sluice: policy <name> version <n> in use (<k> rules)".
var versionInUse = regexp.MustCompile(`^sluice: policy (\S+) version (\d+) in use`)

// WorkerVersions returns, by worker index, the last version of policy each
// worker logged as in use in logs (host.Host.Logs, oldest first). A worker
// takes a version up at its next request or tick after it is published,
// and says so in that line; the filter state tells only for requests a
// rule applies to, so tests that probe for the version in use read the
// log instead. The canary VM is worker -1.
func WorkerVersions(logs []host.LogEntry, policy string) map[int]uint64 {
	out := map[int]uint64{}
	for _, l := range logs {
		m := versionInUse.FindStringSubmatch(l.Message)
		if m == nil || m[1] != policy {
			continue
		}
		if v, err := strconv.ParseUint(m[2], 10, 64); err == nil {
			out[l.Worker] = v
		}
	}
	return out
}
