package limit

import (
	"archive/zip"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	_ "time/tzdata"
)

// zoneNames lists the zones of Go's time zone database (GOROOT/lib/time/zoneinfo.zip,
// the data time/tzdata embeds).
func zoneNames(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	root := strings.TrimSpace(string(out))
	z, err := zip.OpenReader(filepath.Join(root, "lib", "time", "zoneinfo.zip"))
	if err != nil {
		t.Fatalf("zone list: %v", err)
	}
	defer z.Close()
	var names []string
	for _, f := range z.File {
		if !strings.HasSuffix(f.Name, "/") {
			names = append(names, f.Name)
		}
	}
	sort.Strings(names)
	if len(names) < 300 {
		t.Fatalf("only %d zones in %s", len(names), root)
	}
	return names
}

// checkDayWindow checks the calendar-day window of f at now: it ends after now, at
// the first instant whose local date differs from now's, and the window before it ends
// at or before now (so the window containing now starts at or before now).
func checkDayWindow(t *testing.T, name string, f *fixedWindow, now int64) bool {
	t.Helper()
	end := f.windowEnd(now)
	date := func(ns int64) (int, time.Month, int) { return time.Unix(0, ns).In(f.loc).Date() }
	y, m, d := date(now)
	fail := func(why string) bool {
		t.Errorf("%s: window of %s ends at %s: %s", name, time.Unix(0, now).In(f.loc).Format(time.RFC3339Nano),
			time.Unix(0, end).In(f.loc).Format(time.RFC3339Nano), why)
		return false
	}
	if end <= now {
		return fail("not after now")
	}
	if y2, m2, d2 := date(end); y2 == y && m2 == m && d2 == d {
		return fail("still the same local date")
	}
	// The local date is the same from now to end-1: local time is continuous between
	// zone transitions, so check the date at every transition in (now, end) and at end-1.
	cur := now
	for i := 0; ; i++ {
		_, ze := time.Unix(0, cur).In(f.loc).ZoneBounds()
		if ze.IsZero() || ze.UnixNano() >= end || i > 8 {
			break
		}
		e := ze.UnixNano()
		for _, at := range []int64{e - 1, e} {
			if y2, m2, d2 := date(at); y2 != y || m2 != m || d2 != d {
				return fail("the local date changes before the end, at " + time.Unix(0, at).In(f.loc).Format(time.RFC3339Nano))
			}
		}
		cur = e
	}
	if y2, m2, d2 := date(end - 1); y2 != y || m2 != m || d2 != d {
		return fail("the local date changed before the end")
	}
	// The previous window (the one containing the last instant of the day before) ends
	// at or before now and is contiguous with this one.
	start := now
	for i := 0; i < 30; i++ { // walk back to the first instant of now's date
		prev := start - int64(time.Hour)
		if y2, m2, d2 := date(prev); y2 != y || m2 != m || d2 != d {
			break
		}
		start = prev
	}
	if pe := f.windowEnd(start - int64(time.Hour)); pe > now {
		return fail("the window before ends after now, at " + time.Unix(0, pe).In(f.loc).Format(time.RFC3339Nano))
	}
	return true
}

// TestCalendarDayWhereMidnightIsSkipped: where DST starts at local midnight in a zone
// west of Greenwich, the day lasts until the clocks jump (01:00 of the next date): it
// must not end an hour early and give the last hour a window of its own.
func TestCalendarDayWhereMidnightIsSkipped(t *testing.T) {
	for _, tc := range []struct {
		zone string
		day  string
	}{
		{"America/Havana", "2024-03-09"},
		{"America/Santiago", "2024-09-07"},
		{"America/Asuncion", "2024-10-05"},
		{"Atlantic/Azores", "2024-03-30"},
	} {
		loc, err := time.LoadLocation(tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		l := mustNew(t, Config{Algorithm: FixedWindow, Limit: 3, CalendarDay: true, Location: loc})
		day, _ := time.ParseInLocation("2006-01-02", tc.day, loc)
		state := make([]byte, l.StateSize())
		next := make([]byte, l.StateSize())
		admitted := 0
		for h := 12; h < 24; h++ { // twice an hour from noon to midnight, that day
			for _, min := range []int{0, 59} {
				now := time.Date(day.Year(), day.Month(), day.Day(), h, min, 0, 0, loc).UnixNano()
				if d := l.Decide(state, next, now, 1); d.Allowed {
					admitted++
					state, next = next, state
				}
			}
		}
		if admitted != 3 {
			t.Errorf("%s %s: admitted %d from noon to midnight, want 3", tc.zone, tc.day, admitted)
		}
		checkDayWindow(t, tc.zone, l.(*fixedWindow), time.Date(day.Year(), day.Month(), day.Day(), 22, 30, 0, 0, loc).UnixNano())
	}
}

// TestCalendarDayEveryZone: in every zone of the time zone database, for every day of
// 2024 (and the DST-rich 2011) at several hours, the calendar-day window containing an
// instant starts at or before it and ends at the first instant of the next local date.
func TestCalendarDayEveryZone(t *testing.T) {
	names := zoneNames(t)
	years := []int{2024, 2011}
	hours := []time.Duration{0, 90 * time.Minute, 11 * time.Hour, 22*time.Hour + 30*time.Minute, 23*time.Hour + 59*time.Minute}
	if testing.Short() {
		years = years[:1]
	}
	checked := 0
	for _, name := range names {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		f := mustNew(t, Config{Algorithm: FixedWindow, Limit: 1, CalendarDay: true, Location: loc}).(*fixedWindow)
		bad := 0
		for _, y := range years {
			first := time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
			for day := 0; day < 366; day++ {
				for _, h := range hours {
					now := first + int64(day)*int64(24*time.Hour) + int64(h)
					if !checkDayWindow(t, name, f, now) {
						bad++
					}
					checked++
				}
			}
			if bad > 3 {
				break
			}
		}
	}
	t.Logf("%d zones, %d instants", len(names), checked)
}
