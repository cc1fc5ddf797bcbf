package proctest

import (
	"testing"
	"time"
)

// AwaitOneWindow waits, when the current window of length window (aligned to
// the Unix epoch, as fixed windows without a calendar are) ends within need,
// until the next one has begun, so that the counts a test makes in the next
// need fall in one window. It fails the test if the window never ends.
func AwaitOneWindow(t testing.TB, window, need time.Duration) {
	t.Helper()
	end := time.Now().Truncate(window).Add(window)
	if time.Until(end) >= need {
		return
	}
	if !WaitFor(need+time.Minute, func() bool { return time.Now().After(end) }) {
		t.Fatalf("the window of %v ending at %v never ended", window, end)
	}
}
