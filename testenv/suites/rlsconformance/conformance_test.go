package rlsconformance

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// loads are the configurations envoyproxy/ratelimit's tests load and its
// example, each a set of files loaded together (merged when merge).
var loads = []struct {
	name  string
	files []string // under the module's directory
	merge bool
}{
	{name: "basic_config", files: []string{"test/config/basic_config.yaml"}},
	{name: "shadowmode_config", files: []string{"test/config/shadowmode_config.yaml"}},
	{name: "wildcard", files: []string{"test/config/wildcard.yaml"}},
	{name: "share_threshold", files: []string{"test/config/share_threshold.yaml"}},
	{name: "merge_domain", files: []string{"test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"}, merge: true},
	{name: "example", files: []string{"examples/ratelimit/config/example.yaml", "examples/ratelimit/config/config.yaml"}},
}

// TestEveryAnswerIsEnvoyproxyRatelimits sends each load's calls (sequences) to
// envoyproxy/ratelimit and to sluice, each configured from the same files on a
// Redis of its own, one call to one and then to the other, and compares every
// answer (differences).
func TestEveryAnswerIsEnvoyproxyRatelimits(t *testing.T) {
	_, dir := peer(t)
	total := 0
	for _, l := range loads {
		t.Run(l.name, func(t *testing.T) {
			var files []configFile
			for _, f := range l.files {
				files = append(files, configFile{name: filepath.Base(f), path: filepath.Join(dir, f)})
			}
			them := startPeer(t, files, l.merge)
			us := startSluice(t, files, l.merge)
			calls, differ := sendBoth(t, them, us, files, differences)
			t.Logf("%d calls, %d answered differently", calls, differ)
			total += calls
		})
	}
	t.Logf("%d calls in all", total)
}

// TestGlobalModesAndDynamicMetadataAreEnvoyproxyRatelimits runs
// envoyproxy/ratelimit and sluice's ratelimit command from the same files and
// environment, SHADOW_MODE then QUOTA_MODE, each with
// RESPONSE_DYNAMIC_METADATA, sends both basic_config's and
// shadowmode_config's calls (sequences) and compares every answer, its dynamic
// metadata included.
func TestGlobalModesAndDynamicMetadataAreEnvoyproxyRatelimits(t *testing.T) {
	_, dir := peer(t)
	for _, mode := range []string{"SHADOW_MODE", "QUOTA_MODE"} {
		for _, l := range loads[:2] {
			t.Run(mode+"/"+l.name, func(t *testing.T) {
				files := []configFile{{name: filepath.Base(l.files[0]), path: filepath.Join(dir, l.files[0])}}
				env := []string{mode + "=true", "RESPONSE_DYNAMIC_METADATA=true"}
				them, us := startPeer(t, files, false, env...), startSluiceAsRatelimit(t, files, false, env...)
				over := 0
				calls, differ := sendBoth(t, them, us, files, func(a, b *rlsv3.RateLimitResponse) []string {
					if a.GetDynamicMetadata().GetFields()["domain"] == nil {
						t.Fatalf("envoyproxy/ratelimit wrote no dynamic metadata: %v", a)
					}
					if _, ok := a.GetDynamicMetadata().AsMap()["quotaModeViolations"]; ok || a.GetOverallCode() == rlsv3.RateLimitResponse_OK && overLimit(a) {
						over++
					}
					return append(differences(a, b), metadataDifferences(a, b)...)
				})
				t.Logf("%d calls (%d over a limit, answered OK by the mode), %d answered differently", calls, over, differ)
				if over == 0 {
					t.Errorf("no call went over a limit: the mode was not exercised")
				}
			})
		}
	}
}

// sendBoth sends the calls of files' descriptors (sequences) to them and to us,
// one call to one and then to the other, each sequence inside one minute,
// hour and day (a sequence of one-second windows inside one second), and
// reports every pair of answers compare finds differences in. It returns
// the calls sent and how many were answered differently.
func sendBoth(t *testing.T, them, us *service, files []configFile, compare func(them, us *rlsv3.RateLimitResponse) []string) (calls, differ int) {
	t.Helper()
	proctest.AwaitOneWindow(t, time.Minute, 25*time.Second)
	proctest.AwaitOneWindow(t, time.Hour, 25*time.Second)
	proctest.AwaitOneWindow(t, 24*time.Hour, 25*time.Second)
	for _, d := range readTrees(t, files) {
		for _, seq := range sequences(d) {
			if seq[0].second {
				proctest.AwaitOneWindow(t, time.Second, 400*time.Millisecond)
			}
			for _, s := range seq {
				a, b := them.call(t, s.req), us.call(t, s.req)
				calls++
				if diff := compare(a, b); len(diff) > 0 {
					differ++
					t.Errorf("%s: envoyproxy/ratelimit ≠ sluice: %s", s.what, strings.Join(diff, "; "))
				}
			}
		}
	}
	return calls, differ
}

// overLimit reports whether a status of resp is OVER_LIMIT.
func overLimit(resp *rlsv3.RateLimitResponse) bool {
	for _, st := range resp.GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			return true
		}
	}
	return false
}

// refusals are the configurations envoyproxy/ratelimit's tests expect it to
// refuse (test/config/config_test.go), each a set of files loaded together.
var refusals = []struct {
	name  string
	files []string
	merge bool
}{
	{name: "empty_domain", files: []string{"empty_domain.yaml"}},
	{name: "duplicate_domain", files: []string{"basic_config.yaml", "duplicate_domain.yaml"}},
	{name: "merge_domain without merging", files: []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}},
	{name: "merge_domain_key1 twice", files: []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, merge: true},
	{name: "empty_key", files: []string{"empty_key.yaml"}},
	{name: "duplicate_key", files: []string{"duplicate_key.yaml"}},
	{name: "bad_limit_unit", files: []string{"bad_limit_unit.yaml"}},
	{name: "replaces_self", files: []string{"replaces_self.yaml"}},
	{name: "replaces_empty", files: []string{"replaces_empty.yaml"}},
	{name: "bad_yaml", files: []string{"bad_yaml.yaml"}},
	{name: "misspelled_key", files: []string{"misspelled_key.yaml"}},
	{name: "misspelled_key2", files: []string{"misspelled_key2.yaml"}},
	{name: "non_string_key", files: []string{"non_string_key.yaml"}},
	{name: "non_map_list", files: []string{"non_map_list.yaml"}},
	{name: "unlimited_with_unit", files: []string{"unlimited_with_unit.yaml"}},
}

// TestWhatEnvoyproxyRatelimitRefusesImportRefuses loads each refused
// configuration into envoyproxy/ratelimit, which logs why it did not load it,
// and imports it with sluicectl, which must refuse it naming the file.
func TestWhatEnvoyproxyRatelimitRefusesImportRefuses(t *testing.T) {
	_, dir := peer(t)
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			var files []configFile
			for i, f := range r.files {
				// A file loaded twice is two files of the same contents.
				files = append(files, configFile{name: strconv.Itoa(i) + "-" + f, path: filepath.Join(dir, "test/config", f)})
			}
			them := startPeer(t, files, r.merge)
			var why string
			if !proctest.WaitFor(readyTimeout, func() bool {
				out := them.proc.Output()
				i := strings.Index(out, "Error loading new configuration: ")
				if i < 0 {
					return false
				}
				why = strings.SplitN(out[i:], "\n", 2)[0]
				return true
			}) {
				t.Fatalf("envoyproxy/ratelimit loaded %v; its tests expect a refusal", r.files)
			}
			_, stderr, ok := importFiles(t, files, r.merge)
			if ok {
				t.Fatalf("sluicectl import ratelimit accepted %v; envoyproxy/ratelimit: %s", r.files, why)
			}
			if !strings.Contains(stderr, ".yaml") {
				t.Errorf("sluicectl's refusal does not name the file: %s", stderr)
			}
			t.Logf("envoyproxy/ratelimit: %s\nsluicectl: %s", why, strings.TrimSpace(stderr))
		})
	}
}
