package lab

import (
	"bufio"
	"bytes"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// LogLine is one request of an access log in the JSON format envoy/envoy.yaml
// writes (docs/filter.md, "Access log").
type LogLine struct {
	// File and Line locate the line (1-based).
	File string
	Line int64
	// Time is the request's start (%START_TIME%).
	Time time.Time
	// Method and Path are %REQ(:METHOD)% and %REQ_WITHOUT_QUERY(:PATH)%.
	Method, Path string
	// Env is the filter's env the line names (its "env" member), "" when
	// absent.
	Env string
	// ClientIP is %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% ("" when absent).
	ClientIP string
	// Headers are the request headers the log gives (Fields).
	Headers [][2]string
	// Logged is the decision the log recorded (rate_limit), nil when the
	// line has none: no rule applied (null), or the log does not carry the
	// member (HasLogged false).
	Logged    *RateLimit
	HasLogged bool
}

// Fields says which log field gives which request header: header name (lower
// case) → JSON member of a log line.
type Fields map[string]string

// DefaultFields maps the identity headers of a policy to the log's user_id
// and tenant_id, as envoy/envoy.yaml logs them.
func DefaultFields(userHeader, tenantHeader string) Fields {
	f := Fields{}
	if userHeader != "" {
		f[userHeader] = "user_id"
	}
	if tenantHeader != "" {
		f[tenantHeader] = "tenant_id"
	}
	return f
}

// MaxRuns bounds the runs a log may be cut into (see ReadLog).
const MaxRuns = 256

// maxLineBytes bounds one log line.
const maxLineBytes = 1 << 20

// ErrBadLine wraps the problem of a line that is not a request of the
// format; ReadLog skips such lines and counts them.
var ErrBadLine = errors.New("not an access-log line")

// LogReader yields the requests of access logs in timestamp order. Logs of
// several Envoys may be given as several files or concatenated into one:
// ReadLog first cuts the input into runs, each in order but for lines at
// most reorder apart (Envoy writes a line when the request ends, so lines of
// one log are in the order requests ended, not started), a new run starting
// where the time goes back further than that; then it merges the runs. It
// holds in memory the lines of one reorder window of each run, whatever the
// length of the logs.
type LogReader struct {
	fields  Fields
	reorder time.Duration
	runs    []*run
	pending lineHeap
	seq     uint64
	// Skipped counts lines that are not requests (no timestamp, not JSON);
	// FirstSkip describes the first.
	Skipped   int64
	FirstSkip string
}

// run is a stretch of one file whose lines are in order within reorder.
type run struct {
	file       string
	start, end int64 // byte offsets
	firstLine  int64
	f          *os.File
	r          *bufio.Reader
	pos        int64
	line       int64
	high       time.Time // the latest time read so far
	done       bool
}

// ReadLog opens the logs for reading in timestamp order; fields maps
// request headers to log members; reorder is how far out of order the lines
// of one log may be (at least 0). Errors: a file that cannot be read, a log
// of more than MaxRuns runs.
func ReadLog(files []string, fields Fields, reorder time.Duration) (*LogReader, error) {
	lr := &LogReader{fields: fields, reorder: max(reorder, 0)}
	for _, name := range files {
		if err := lr.cut(name); err != nil {
			lr.Close()
			return nil, err
		}
	}
	for _, r := range lr.runs {
		f, err := os.Open(r.file)
		if err != nil {
			lr.Close()
			return nil, err
		}
		if _, err := f.Seek(r.start, io.SeekStart); err != nil {
			f.Close()
			lr.Close()
			return nil, err
		}
		r.f, r.r, r.pos, r.line = f, bufio.NewReaderSize(f, 256<<10), r.start, r.firstLine-1
	}
	return lr, nil
}

// cut scans one file for where its runs begin.
func (lr *LogReader) cut(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 256<<10)
	var pos, line int64
	cur := &run{file: name, start: 0, firstLine: 1}
	var high time.Time
	for {
		b, n, err := readLine(br)
		if n > 0 {
			line++
			if t, ok := quickTime(b); ok {
				if !high.IsZero() && t.Before(high.Add(-lr.reorder)) {
					cur.end = pos
					lr.runs = append(lr.runs, cur)
					if len(lr.runs) >= MaxRuns {
						return fmt.Errorf("%s:%d: the log goes back in time more than %d times by more than --reorder %s: sort it by timestamp first (for example jq -c -s 'sort_by(.timestamp)[]')", name, line, MaxRuns, lr.reorder)
					}
					cur = &run{file: name, start: pos, firstLine: line}
					high = time.Time{}
				}
				if t.After(high) {
					high = t
				}
			}
			pos += n
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	cur.end = pos
	if cur.end > cur.start {
		lr.runs = append(lr.runs, cur)
	}
	return nil
}

// readLine returns the next line with its newline, and how many bytes it
// took from br. A line longer than maxLineBytes is consumed whole but only
// its first maxLineBytes+1 bytes are kept, so that it fails to parse without
// a runaway line filling memory.
func readLine(br *bufio.Reader) ([]byte, int64, error) {
	b, err := br.ReadSlice('\n')
	n := int64(len(b))
	if err != bufio.ErrBufferFull {
		return b, n, err
	}
	buf := append([]byte(nil), b...)
	for err == bufio.ErrBufferFull {
		b, err = br.ReadSlice('\n')
		n += int64(len(b))
		if room := maxLineBytes + 1 - len(buf); room > 0 {
			buf = append(buf, b[:min(room, len(b))]...)
		}
	}
	return buf, n, err
}

// quickTime finds a line's "timestamp" member without decoding the line: the
// first "timestamp" string followed by a colon. In valid JSON an unescaped string
// followed by a colon is a member name, so a client-chosen value that is the
// string "timestamp" (a query, a request id) is passed over.
func quickTime(b []byte) (time.Time, bool) {
	const name = `"timestamp"`
	for off := 0; ; {
		i := bytes.Index(b[off:], []byte(name))
		if i < 0 {
			return time.Time{}, false
		}
		rest := bytes.TrimLeft(b[off+i+len(name):], " \t")
		off += i + len(name)
		if len(rest) == 0 || rest[0] != ':' {
			continue // a value, not the member
		}
		rest = bytes.TrimLeft(rest[1:], " \t")
		if len(rest) == 0 || rest[0] != '"' {
			return time.Time{}, false
		}
		end := bytes.IndexByte(rest[1:], '"')
		if end < 0 {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339Nano, string(rest[1:1+end]))
		return t, err == nil
	}
}

// Runs returns how many runs the logs were cut into.
func (lr *LogReader) Runs() int { return len(lr.runs) }

// Next returns the next request in timestamp order (ties in input order),
// or io.EOF after the last.
func (lr *LogReader) Next() (*LogLine, error) {
	for {
		// The earliest a line not yet read can be: every unfinished run's
		// latest time, less the reorder slack.
		var low time.Time
		var next *run
		for _, r := range lr.runs {
			if r.done {
				continue
			}
			if next == nil || r.high.Before(next.high) {
				next = r
			}
		}
		if next != nil {
			low = next.high.Add(-lr.reorder)
		}
		if len(lr.pending) > 0 && (next == nil || lr.pending[0].l.Time.Before(low)) {
			return heap.Pop(&lr.pending).(pendingLine).l, nil
		}
		if next == nil {
			return nil, io.EOF
		}
		if err := lr.read(next); err != nil {
			return nil, err
		}
	}
}

// read reads run r's next line into pending (or marks it done).
func (lr *LogReader) read(r *run) error {
	for {
		if r.pos >= r.end {
			r.done = true
			return nil
		}
		b, n, err := readLine(r.r)
		r.pos += n
		if n == 0 && err != nil {
			r.done = true
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("%s: %w", r.file, err)
		}
		r.line++
		l, perr := lr.parse(b)
		if perr != nil {
			if len(bytes.TrimSpace(b)) > 0 {
				lr.Skipped++
				if lr.FirstSkip == "" {
					lr.FirstSkip = fmt.Sprintf("%s:%d: %v", r.file, r.line, perr)
				}
			}
			continue
		}
		l.File, l.Line = r.file, r.line
		if l.Time.After(r.high) {
			r.high = l.Time
		}
		lr.seq++
		heap.Push(&lr.pending, pendingLine{l: l, seq: lr.seq})
		return nil
	}
}

// Close closes the files.
func (lr *LogReader) Close() {
	for _, r := range lr.runs {
		if r.f != nil {
			r.f.Close()
			r.f = nil
		}
	}
}

// logJSON is the members of a line every replay reads, and the identity
// members envoy/envoy.yaml logs.
type logJSON struct {
	Timestamp string          `json:"timestamp"`
	Env       *string         `json:"env"`
	Method    *string         `json:"method"`
	Path      *string         `json:"path"`
	ClientIP  *string         `json:"client_ip"`
	UserID    json.RawMessage `json:"user_id"`
	TenantID  json.RawMessage `json:"tenant_id"`
	RateLimit json.RawMessage `json:"rate_limit"`
}

// member returns a member logJSON holds, false for any other (the line is
// then decoded a second time).
func (j *logJSON) member(name string) (json.RawMessage, bool) {
	switch name {
	case "user_id":
		return j.UserID, true
	case "tenant_id":
		return j.TenantID, true
	}
	return nil, false
}

func (lr *LogReader) parse(b []byte) (*LogLine, error) {
	if len(b) > maxLineBytes {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrBadLine, maxLineBytes)
	}
	var j logJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadLine, err)
	}
	t, err := time.Parse(time.RFC3339Nano, j.Timestamp)
	if err != nil {
		return nil, fmt.Errorf("%w: timestamp %q is not an RFC 3339 time", ErrBadLine, j.Timestamp)
	}
	l := &LogLine{Time: t, Method: value(j.Method), Path: value(j.Path), ClientIP: value(j.ClientIP), Env: value(j.Env)}
	if l.Method == "" {
		l.Method = "GET"
	}
	if l.Path == "" {
		return nil, fmt.Errorf("%w: no path", ErrBadLine)
	}
	var all map[string]json.RawMessage
	for h, field := range lr.fields {
		raw, ok := j.member(field)
		if !ok {
			if all == nil {
				if err := json.Unmarshal(b, &all); err != nil {
					return nil, fmt.Errorf("%w: %v", ErrBadLine, err)
				}
			}
			raw = all[field]
		}
		if v, ok := scalarText(raw); ok {
			l.Headers = append(l.Headers, [2]string{h, v})
		}
	}
	// Fields is a map: sorted, the headers are the same from run to run.
	slices.SortFunc(l.Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	l.Logged, l.HasLogged = loggedDecision(j.RateLimit), j.RateLimit != nil
	return l, nil
}

// value is a logged string, "" for null and for Envoy's "-" (no value).
func value(s *string) string {
	if s == nil || *s == "-" {
		return ""
	}
	return *s
}

// scalarText is a member's value as a header value: a string (not "" nor
// "-") or a number; false for null, objects and the rest.
func scalarText(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || s == "" || s == "-" {
			return "", false
		}
		return s, true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), true
	}
	return "", false
}

// loggedDecision reads rate_limit: the filter state as a JSON string (what
// envoy/envoy.yaml logs), or as an object; nil for null or anything else.
func loggedDecision(raw json.RawMessage) *RateLimit {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil || !strings.HasPrefix(strings.TrimSpace(s), "{") {
			return nil
		}
		raw = []byte(s)
	}
	var rl RateLimit
	if json.Unmarshal(raw, &rl) != nil {
		return nil
	}
	return &rl
}

type pendingLine struct {
	l   *LogLine
	seq uint64
}

// lineHeap orders lines by time, then by when they were read.
type lineHeap []pendingLine

func (h lineHeap) Len() int { return len(h) }
func (h lineHeap) Less(i, j int) bool {
	if !h[i].l.Time.Equal(h[j].l.Time) {
		return h[i].l.Time.Before(h[j].l.Time)
	}
	return h[i].seq < h[j].seq
}
func (h lineHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *lineHeap) Push(x any)   { *h = append(*h, x.(pendingLine)) }
func (h *lineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = pendingLine{}
	*h = old[:len(old)-1]
	return x
}
