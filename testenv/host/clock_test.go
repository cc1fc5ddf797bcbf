package host

import (
	"testing"
	"time"
)

// Advance fires a periodic timer once per period; Skip fires each due timer
// once, at the new time, as a process stopped for that long would.
func TestVirtualClockSkipFiresEachDueTimerOnce(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewVirtualClock(start)
	var fired []time.Time
	var arm func()
	arm = func() {
		c.AfterFunc(time.Second, func() { fired = append(fired, c.Now()); arm() })
	}
	arm()
	other := 0
	c.AfterFunc(time.Hour, func() { other++ })
	c.AfterFunc(48*time.Hour, func() { other += 100 })

	c.Advance(3 * time.Second)
	if len(fired) != 3 || !fired[2].Equal(start.Add(3*time.Second)) {
		t.Fatalf("Advance(3s) fired the tick at %v, want each second", fired)
	}
	fired = nil
	c.Skip(24 * time.Hour)
	want := start.Add(3*time.Second + 24*time.Hour)
	if len(fired) != 1 || !fired[0].Equal(want) || other != 1 || !c.Now().Equal(want) {
		t.Fatalf("Skip(24h): tick fired at %v, the hour timer %d times, now %v; want once at %v", fired, other, c.Now(), want)
	}
	c.Advance(time.Second)
	if len(fired) != 2 || !fired[1].Equal(want.Add(time.Second)) {
		t.Fatalf("after Skip the tick fired at %v, want a second later", fired)
	}
}
