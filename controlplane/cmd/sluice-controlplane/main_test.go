package main

import (
	"runtime/debug"
	"testing"
)

// TestTheGCTargetIsGCPercentUnlessTheEnvironmentSetsGOGC: without GOGC the
// target becomes gcPercent; with it, tuneGC leaves the runtime's.
func TestTheGCTargetIsGCPercentUnlessTheEnvironmentSetsGOGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	tuneGC(func(string) (string, bool) { return "", false })
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("without GOGC the target is %d, want %d", got, gcPercent)
	}
	tuneGC(func(k string) (string, bool) { return "100", k == "GOGC" })
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC=100 the target is %d, want it left at 100", got)
	}
}
