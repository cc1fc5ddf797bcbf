package main

import (
	"strings"
	"testing"
)

// TestWalkthroughIsReadFromTheREADME: the steps make run prints are the README's:
// six numbered steps, every ```sh command of the walkthrough among them.
func TestWalkthroughIsReadFromTheREADME(t *testing.T) {
	steps, err := walkthrough("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, st := range steps {
		if !strings.HasPrefix(st.title, string(rune('1'+i))+". ") || strings.HasSuffix(st.title, ".") {
			t.Errorf("step %d title %q", i+1, st.title)
		}
		if len(st.commands) == 0 {
			t.Errorf("step %q has no command", st.title)
		}
		n += len(st.commands)
	}
	if len(steps) != 6 || n != 12 {
		t.Fatalf("%d steps, %d commands; want 6 and 12", len(steps), n)
	}
	if steps[0].title != "1. Trip a limit" || !strings.Contains(steps[0].commands[0], "http://127.0.0.1:10000/api/hello") {
		t.Fatalf("step 1: %+v", steps[0])
	}
}
