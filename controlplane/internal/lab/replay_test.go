package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// The replay of a log decides every request as a fixed window counted
// independently here does: per user and minute, the first limit requests
// pass and the rest are denied. The log is written in the order requests
// ended (up to 2 s after they began) and cut in two files, and a second rule
// keyed on the client address counts per Envoy when the log is dealt to
// three.
func TestReplayDeniesExactlyWhatAFixedWindowCounts(t *testing.T) {
	bin := testModule(t)
	const limit = 4
	pol := mustPolicy(t, fmt.Sprintf(`{"policy":"exact","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"per-user-minute","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"fixed_window","limit":%d,"window":"1m"}]}`, limit))
	reqs := genLog(3, 6000, 40, DefaultStart.Add(17*time.Second), 25*time.Millisecond)

	// Expected, counted here: the n-th request of a user in a minute is
	// denied when n > limit.
	type bucket struct {
		user   string
		minute int64
	}
	seen := map[bucket]int{}
	wantDenied := map[string]bool{} // user@time
	for _, r := range reqs {
		b := bucket{r.user, r.t.Unix() / 60}
		seen[b]++
		if seen[b] > limit {
			wantDenied[r.user+"@"+r.t.UTC().Format(time.RFC3339Nano)] = true
		}
	}
	if len(wantDenied) == 0 || len(wantDenied) == len(reqs) {
		t.Fatalf("the generated log denies %d of %d: a test of nothing", len(wantDenied), len(reqs))
	}

	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	writeLog(t, a, reqs[:len(reqs)/2], 2*time.Second, 4)
	writeLog(t, b, reqs[len(reqs)/2:], 2*time.Second, 5)
	// One worker runs the log in batches (Fleet.DoAt), two request by request.
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			replayExactly(t, bin, pol, []string{b, a}, reqs, wantDenied, workers)
		})
	}
}

func replayExactly(t *testing.T, bin []byte, pol *rules.Policy, logs []string, reqs []genRequest, wantDenied map[string]bool, workers int) {
	lr, err := ReadLog(logs, DefaultFields("x-user-id", ""), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	var last time.Time
	gotDenied := map[string]bool{}
	rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Workers: workers, OnDecision: func(l *LogLine, d Decision) {
		if l.Time.Before(last) {
			t.Errorf("%s:%d at %s replayed after %s", l.File, l.Line, l.Time, last)
		}
		last = l.Time
		if d.RateLimit != nil && d.RateLimit.RateLimited {
			gotDenied[l.Headers[0][1]+"@"+l.Time.UTC().Format(time.RFC3339Nano)] = true
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != int64(len(reqs)) {
		t.Fatalf("replayed %d requests, want %d", rep.Requests, len(reqs))
	}
	for k := range wantDenied {
		if !gotDenied[k] {
			t.Errorf("request %s allowed, want denied", k)
		}
	}
	for k := range gotDenied {
		if !wantDenied[k] {
			t.Errorf("request %s denied, want allowed", k)
		}
	}
	r := rep.Rules[0]
	if r.Denied != int64(len(wantDenied)) || r.Matched != int64(len(reqs)) || r.Allowed != int64(len(reqs)-len(wantDenied)) {
		t.Errorf("rule report matched %d allowed %d denied %d, want %d, %d, %d", r.Matched, r.Allowed, r.Denied,
			len(reqs), len(reqs)-len(wantDenied), len(wantDenied))
	}
	if rep.Overflows != 0 {
		t.Errorf("%d table overflows", rep.Overflows)
	}
	t.Logf("%d requests, %d denied, exactly as counted", rep.Requests, r.Denied)
}

// Two replays of one log give the same report, fleet rules and several
// Envoys included.
func TestReplayIsDeterministic(t *testing.T) {
	bin := testModule(t)
	pol := mustPolicy(t, `{"policy":"det","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"local-bucket","key":["user"],"algorithm":"token_bucket","limit":20,"window":"1m","burst":5},
 {"id":"fleet-window","key":["user"],"algorithm":"fixed_window","limit":30,"window":"1m","scope":"fleet"},
 {"id":"user-shadow","key":["user"],"algorithm":"gcra","limit":1,"window":"10s","burst":1,"shadow":true}]}`)
	path := filepath.Join(t.TempDir(), "access.log")
	writeLog(t, path, genLog(11, 3000, 12, DefaultStart, 40*time.Millisecond), time.Second, 12)
	run := func() string {
		lr, err := ReadLog([]string{path}, DefaultFields("x-user-id", ""), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close()
		rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Envoys: 3, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rules[1].Denied == 0 || rep.Rules[0].Denied == 0 || rep.Rules[2].ShadowDenied == 0 {
			t.Fatalf("a rule denied nothing: %+v", rep.Rules)
		}
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first, second := run(), run()
	if first != second {
		t.Fatalf("two replays differ:\n%s\n%s", first, second)
	}
}

// Fleet rules hold their limit across the Envoys the log is dealt to;
// envoy-scoped rules count per Envoy.
func TestReplayCountsFleetRulesAsOneBudget(t *testing.T) {
	bin := testModule(t)
	pol := mustPolicy(t, `{"policy":"scopes","rules":[
 {"id":"fleet","match":{"path_prefix":"/f/"},"key":[],"algorithm":"fixed_window","limit":100,"window":"1h","scope":"fleet"},
 {"id":"local","match":{"path_prefix":"/l/"},"key":[],"algorithm":"fixed_window","limit":100,"window":"1h"}]}`)
	path := filepath.Join(t.TempDir(), "access.log")
	var b strings.Builder
	at := DefaultStart
	for i := range 1000 {
		p := "/f/x"
		if (i/4)%2 == 1 { // every Envoy gets both paths: line i goes to Envoy i mod 4
			p = "/l/x"
		}
		at = at.Add(50 * time.Millisecond)
		fmt.Fprintf(&b, `{"timestamp":%q,"method":"GET","path":%q,"client_ip":"192.0.2.%d"}`+"\n", at.Format(time.RFC3339Nano), p, i%200)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	lr, err := ReadLog([]string{path}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Envoys: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Rules[0].Allowed; got != 100 {
		t.Errorf("fleet rule admitted %d of 500 across 4 Envoys, want its limit 100", got)
	}
	if got := rep.Rules[1].Allowed; got != 400 {
		t.Errorf("envoy rule admitted %d of 500 across 4 Envoys, want 4 × 100", got)
	}
	if rep.LocalRules != "per envoy" {
		t.Errorf("local_rules %q", rep.LocalRules)
	}
}

// The reader merges logs in timestamp order: lines out of order within the
// reorder window, logs concatenated into one file, lines that are not
// requests skipped and counted; a log that goes back too often is refused.
func TestLogReaderMergesConcatenatedLogs(t *testing.T) {
	dir := t.TempDir()
	line := func(ms int, path string) string {
		return fmt.Sprintf(`{"timestamp":%q,"method":"GET","path":%q,"user_id":"u","rate_limit":"{\"rate_limited\":true,\"shadow\":false,\"rule\":\"r\"}"}`+"\n",
			DefaultStart.Add(time.Duration(ms)*time.Millisecond).Format(time.RFC3339Nano), path)
	}
	// Two Envoys' logs, each slightly out of order, concatenated, and junk.
	content := line(0, "/a0") + line(300, "/a2") + line(200, "/a1") + line(900, "/a3") +
		"not json\n" + `{"path":"/no-time"}` + "\n" +
		line(100, "/b0") + line(500, "/b2") + line(400, "/b1")
	path := filepath.Join(dir, "all.log")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	lr, err := ReadLog([]string{path}, Fields{"x-user-id": "user_id"}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	var got []string
	for {
		l, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.Logged == nil || !l.Logged.RateLimited || l.Headers[0] != [2]string{"x-user-id", "u"} {
			t.Errorf("%s: logged %+v headers %v", l.Path, l.Logged, l.Headers)
		}
		got = append(got, l.Path)
	}
	if want := "/a0 /b0 /a1 /a2 /b1 /b2 /a3"; strings.Join(got, " ") != want {
		t.Errorf("order %v, want %s", got, want)
	}
	if lr.Runs() != 2 || lr.Skipped != 2 || !strings.Contains(lr.FirstSkip, "all.log:5") {
		t.Errorf("runs %d, skipped %d (%s)", lr.Runs(), lr.Skipped, lr.FirstSkip)
	}

	var b strings.Builder
	for i := range MaxRuns + 1 {
		b.WriteString(line(1000, "/x") + line(0, fmt.Sprint(i)))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLog([]string{path}, nil, 0); err == nil || !strings.Contains(err.Error(), "sort it") {
		t.Errorf("a log that goes back %d times: %v", MaxRuns+1, err)
	}
}

// The filter's decision record decodes with every member the access log
// documents; an unknown member is skipped and malformed text is an error.
func TestDecodeRateLimit(t *testing.T) {
	rl, err := decodeRateLimit([]byte(`{"rate_limited":true,"shadow":false,"policy_version":7,"rule":"login-per-ip","key":"rl:prod:edge/login-per-ip:ip=198.51.100.1:300s","limit":3,"remaining":0,"reset":287,"scope":"fleet","quota":"waited","reason":"quota_unavailable","trace_id":"5f0c","future":{"a":[1]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := RateLimit{RateLimited: true, PolicyVersion: 7, Rule: "login-per-ip", Key: "rl:prod:edge/login-per-ip:ip=198.51.100.1:300s",
		Limit: 3, Reset: 287, Scope: "fleet", Quota: "waited", Reason: "quota_unavailable"}
	if *rl != want {
		t.Errorf("decoded %+v, want %+v", *rl, want)
	}
	for _, bad := range []string{``, `{"rate_limited":"yes"}`, `{"limit":-1}`, `{"rule":"x"} extra`, `[1]`} {
		if _, err := decodeRateLimit([]byte(bad)); err == nil {
			t.Errorf("%q decoded without an error", bad)
		}
	}
}

// A line longer than the limit is skipped without being kept whole, and
// the lines after it are read from where they start.
func TestLogReaderSkipsAnOverlongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "long.log")
	long := `{"timestamp":"2026-01-01T00:00:00Z","path":"/` + strings.Repeat("a", 3*maxLineBytes) + `"}` + "\n"
	next := `{"timestamp":"2026-01-01T00:00:01Z","path":"/after"}` + "\n"
	if err := os.WriteFile(path, []byte(long+next), 0o644); err != nil {
		t.Fatal(err)
	}
	lr, err := ReadLog([]string{path}, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	l, err := lr.Next()
	if err != nil || l.Path != "/after" || l.Line != 2 {
		t.Fatalf("got %+v, %v; want /after at line 2", l, err)
	}
	if _, err := lr.Next(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
	if lr.Skipped != 1 || !strings.Contains(lr.FirstSkip, "long.log:1") {
		t.Errorf("skipped %d (%s)", lr.Skipped, lr.FirstSkip)
	}
}

// TestTheTimeOfALineIsItsTimestampMember: a line whose client-chosen values come
// before its "timestamp" member and are the string "timestamp" (a query, a request
// id) is read at its own time: logged more than --reorder late, it still starts a
// new run and is replayed in its place, never where it happens to stand.
func TestTheTimeOfALineIsItsTimestampMember(t *testing.T) {
	dir := t.TempDir()
	line := func(ms int, path, query, id string) string {
		return fmt.Sprintf(`{"path":%q,"query":%q,"request_id":%q,"timestamp":%q,"method":"GET"}`+"\n",
			path, query, id, DefaultStart.Add(time.Duration(ms)*time.Millisecond).Format(time.RFC3339Nano))
	}
	content := line(0, "/a", "", "1") + line(1000, "/b", "", "2") + line(2000, "/c", "", "3") +
		line(500, "/late", "timestamp", "timestamp") + line(3000, "/d", "", "5")
	path := filepath.Join(dir, "access.log")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	lr, err := ReadLog([]string{path}, nil, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	var got []string
	for {
		l, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Path)
	}
	if want := "/a /late /b /c /d"; strings.Join(got, " ") != want {
		t.Fatalf("order %v, want %s", got, want)
	}
	for _, c := range []struct{ line, want string }{
		{`{"q":"timestamp","timestamp":"2026-01-02T03:04:05Z"}`, "2026-01-02T03:04:05Z"},
		{`{"q":"timestamp", "r" : "timestamp" ,"timestamp" : "2026-01-02T03:04:05Z"}`, "2026-01-02T03:04:05Z"},
		{`{"q":"timestamp"}`, ""},
	} {
		tm, ok := quickTime([]byte(c.line))
		if got := map[bool]string{true: tm.UTC().Format(time.RFC3339), false: ""}[ok]; got != c.want {
			t.Errorf("quickTime(%s) = %q, want %q", c.line, got, c.want)
		}
	}
}

// TestReplayIsBoundedByTheLinesNotTheSpan: one far-off timestamp neither hangs nor
// exhausts the replay. A line more than MaxGap after the one before it (a year: a
// 9999 date among 2026 lines, a first line of 1970) refuses the run, naming the
// line; lines within it but months apart keep one per-minute count per minute that
// has lines, not one per minute of the span.
func TestReplayIsBoundedByTheLinesNotTheSpan(t *testing.T) {
	bin := testModule(t)
	pol := mustPolicy(t, `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"per-user","key":["user"],"algorithm":"fixed_window","limit":3,"window":"1m"}]}`)
	line := func(ts string) string {
		return `{"timestamp":"` + ts + `","method":"GET","path":"/a","user_id":"u"}` + "\n"
	}
	near := line("2026-11-27T10:00:00Z") + line("2026-11-27T10:00:01Z") + line("2026-11-27T10:00:02Z")
	replay := func(content string) (*Report, error) {
		path := filepath.Join(t.TempDir(), "access.log")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		lr, err := ReadLog([]string{path}, Fields{"x-user-id": "user_id"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return Replay(ctx, bin, pol, lr, ReplayOptions{Workers: 1})
	}
	for name, content := range map[string]string{
		"a line of 9999 last":  near + line("9999-01-01T00:00:00Z"),
		"a line of 1970 first": line("1970-01-01T00:00:01Z") + near,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := replay(content)
			if err == nil || !strings.Contains(err.Error(), "access.log:") || !strings.Contains(err.Error(), "after the line before") {
				t.Fatalf("Replay: %v, want a refusal naming the line", err)
			}
			t.Log(err)
		})
	}
	t.Run("months apart", func(t *testing.T) {
		rep, err := replay(near + line("2027-05-01T10:00:00Z"))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(rep.Rules[0].PerMinute); n != 2 {
			t.Fatalf("%d per-minute counts for 2 minutes with lines five months apart, want 2", n)
		}
		if rep.Requests != 4 || rep.Denied != 0 {
			t.Fatalf("requests %d, denied %d; want 4 and 0", rep.Requests, rep.Denied)
		}
	})
}

// TestARequestARuleCannotKeyIsNotCountedUnderIt: a request a rule matches but
// cannot form its key for (a per-user rule, no user id) is not counted by the
// filter, so the report does not show it as matched or allowed under that rule.
func TestARequestARuleCannotKeyIsNotCountedUnderIt(t *testing.T) {
	bin := testModule(t)
	pol := mustPolicy(t, `{"policy":"p","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"per-user","key":["user"],"algorithm":"fixed_window","limit":3,"window":"1m"}]}`)
	content := `{"timestamp":"2026-11-27T10:00:00Z","method":"GET","path":"/a","user_id":"u"}` + "\n" +
		`{"timestamp":"2026-11-27T10:00:01Z","method":"GET","path":"/a"}` + "\n"
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	lr, err := ReadLog([]string{path}, Fields{"x-user-id": "user_id"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Rules[0]; rep.Requests != 2 || r.Matched != 1 || r.Allowed != 1 {
		t.Fatalf("requests %d; per-user matched %d allowed %d, want 2; 1 and 1 (the request without a user is not the rule's)", rep.Requests, r.Matched, r.Allowed)
	}
}

// TestReplayKeysAreInTheLogsEnv: the candidate's counter keys are built with
// the env the log's lines name (envoy.yaml logs the filter's env), so the keys
// a replay reports are those the proxy counted under; ReplayOptions.Env, when
// set, wins.
func TestReplayKeysAreInTheLogsEnv(t *testing.T) {
	bin := testModule(t)
	pol := mustPolicy(t, `{"policy":"envs","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"per-user","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"fixed_window","limit":1,"window":"1m"}]}`)
	log := filepath.Join(t.TempDir(), "a.log")
	writeLog(t, log, genLog(5, 200, 3, DefaultStart.Add(5*time.Second), 10*time.Millisecond), 0, 1)
	for _, c := range []struct{ env, want string }{{"", "rl:prod:"}, {"staging", "rl:staging:"}} {
		lr, err := ReadLog([]string{log}, DefaultFields("x-user-id", ""), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Env: c.env})
		lr.Close()
		if err != nil {
			t.Fatal(err)
		}
		keys := rep.Rules[0].TopKeys
		if len(keys) == 0 {
			t.Fatalf("env %q: no key denied", c.env)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k.Key, c.want) {
				t.Errorf("env %q: key %q, want it under %s", c.env, k.Key, c.want)
			}
		}
	}
}
