package proctest

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/envoy/monitoring"
)

// ServedSeries returns the metric names served by the Prometheus text
// endpoints at urls (e.g. a control plane's /metrics and a proxy's
// /stats/prometheus). A request that fails fails the test.
func ServedSeries(t testing.TB, urls ...string) map[string]bool {
	t.Helper()
	served := map[string]bool{}
	for _, u := range urls {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || line[0] == '#' {
				continue
			}
			if i := strings.IndexAny(line, "{ "); i > 0 {
				served[line[:i]] = true
			}
		}
	}
	return served
}

// CheckDashboardSeries fails the test for every series that the Grafana
// dashboard or the alert rules of root/envoy/monitoring select and that no
// name in served matches, and if fewer than 20 series were checked. It
// returns how many were checked.
func CheckDashboardSeries(t testing.TB, root string, served map[string]bool) int {
	t.Helper()
	dash, err := os.ReadFile(filepath.Join(root, "envoy", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(root, "envoy", "monitoring", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	exprs, _, err := monitoring.Expressions(dash, rules)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range exprs {
		series, err := monitoring.Series(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, re := range series {
			checked++
			found := false
			for name := range served {
				found = found || re.MatchString(name)
			}
			if !found {
				t.Errorf("%s selects %s, which nothing serves", e, re)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d series checked", checked)
	}
	return checked
}
