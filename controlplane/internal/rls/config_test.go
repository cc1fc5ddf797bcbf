package rls

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// TestAnEntryOfAnEnvoyActionIsProducedByThatAction: an entry whose key is one
// of Envoy's rate limit actions (destination_cluster, source_cluster,
// remote_address) is produced by that action even with an exact value, never
// by a generic_key carrying the value (which every request on the route would
// send); an exact value the bootstrap's one route cannot produce is left off
// it with a note saying where it belongs.
func TestAnEntryOfAnEnvoyActionIsProducedByThatAction(t *testing.T) {
	p, err := rules.ParsePolicy([]byte(`{"policy":"p","rules":[
 {"id":"payments","descriptor":{"domain":"d","entries":[{"key":"destination_cluster","value":"payments"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"},
 {"id":"here","descriptor":{"domain":"d","entries":[{"key":"destination_cluster","value":"upstream"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"},
 {"id":"office","descriptor":{"domain":"d","entries":[{"key":"remote_address","value":"10.0.0.1"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"},
 {"id":"from","descriptor":{"domain":"d","entries":[{"key":"source_cluster"},{"key":"destination_cluster"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"},
 {"id":"api","descriptor":{"domain":"d","entries":[{"key":"generic_key","value":"api"}]},"algorithm":"fixed_window","limit":5,"window":"1s","scope":"fleet"}
]}`))
	if err != nil {
		t.Fatal(err)
	}
	kind := func(a *routev3.RateLimit_Action) string {
		switch a.ActionSpecifier.(type) {
		case *routev3.RateLimit_Action_DestinationCluster_:
			return "destination_cluster"
		case *routev3.RateLimit_Action_SourceCluster_:
			return "source_cluster"
		case *routev3.RateLimit_Action_RemoteAddress_:
			return "remote_address"
		case *routev3.RateLimit_Action_GenericKey_:
			return "generic_key"
		}
		return "other"
	}
	for i, want := range [][]string{{"destination_cluster"}, {"destination_cluster"}, {"remote_address"}, {"source_cluster", "destination_cluster"}, {"generic_key"}} {
		actions, _ := Actions(&p.Identity, p.Rules[i].Descriptor)
		var got []string
		for _, a := range actions {
			got = append(got, kind(a))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("rule %s: actions %v, want %v", p.Rules[i].ID, got, want)
		}
	}
	doc, notes, err := EnvoyConfig(p, ConfigOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(notes, "\n")
	if !strings.Contains(all, "rule payments") || !strings.Contains(all, `cluster "payments"`) {
		t.Errorf("no note on where the payments rule's entry belongs:\n%s", all)
	}
	if strings.Contains(all, "rule here:") {
		t.Errorf("a note on a rule the route produces:\n%s", all)
	}
	if strings.Count(string(doc), "- destination_cluster: {}") != 2 || strings.Contains(string(doc), "descriptor_value: payments") {
		t.Errorf("the route's rate_limits:\n%s", doc)
	}
}
