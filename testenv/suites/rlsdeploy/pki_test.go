package rlsdeploy

import (
	"slices"
	"testing"

	"github.com/sluice-proxy/sluice/testenv/testkit/testpki"
)

func newCA(t *testing.T) *testpki.CA { return testpki.NewCA(t, "rlsdeploy CA") }

func leaf(dns string) testpki.Leaf { return testpki.Leaf{CommonName: dns, DNS: []string{dns}} }

func slicesSort(s []string) { slices.Sort(s) }
