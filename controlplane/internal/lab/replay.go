package lab

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// ReplayOptions configure Replay.
type ReplayOptions struct {
	// Envoys deals the log's requests to this many simulated Envoys in turn
	// (default 1: the whole log through one Envoy). Rules with "scope":
	// "envoy" count per Envoy; rules with "scope": "fleet" hold their limit
	// across all of them through the in-process quota service.
	Envoys int
	// Workers is each Envoy's worker VMs (default 1).
	Workers int
	// TopKeys is how many keys each rule lists by denials (default 10).
	TopKeys int
	// Env is the environment name in the candidate's counter keys (the
	// filter's "env"); "" takes the log's first line's env member (what
	// envoy/envoy.yaml logs), else "default".
	Env string
	// Progress, if set, is called about every 65,536 requests with the
	// requests replayed so far.
	Progress func(requests int64)
	// OnDecision, if set, sees every request with the candidate's decision.
	OnDecision func(l *LogLine, d Decision)
}

// Report is what a replay found. Counts are requests; times are the log's.
type Report struct {
	// Requests is the number of requests replayed; Skipped the lines that
	// were not requests (FirstSkip says where the first was).
	Requests  int64  `json:"requests"`
	Skipped   int64  `json:"skipped_lines"`
	FirstSkip string `json:"first_skipped,omitempty"`
	// From and To are the first and last request's times.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Envoys is the number of simulated Envoys; LocalRules says how rules of
	// scope "envoy" counted: "one envoy" or "per envoy".
	Envoys     int    `json:"envoys"`
	LocalRules string `json:"local_rules"`
	// Allowed and Denied are the candidate's decisions over all requests.
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	// Logged compares with the decisions the log recorded, for the requests
	// whose line has one.
	Logged LoggedComparison `json:"against_log"`
	// Rules are per rule of the candidate policy, in policy order.
	Rules []RuleReport `json:"rules"`
	// Overflows counts decisions the filter made against a full table's
	// overflow state (sluice.bucket_overflow): non-zero means the policy's
	// keys outgrew the filter's tables and decisions were approximate.
	Overflows uint64 `json:"table_overflows"`
}

// LoggedComparison counts how the candidate differs from the log.
type LoggedComparison struct {
	// Compared is the number of requests whose line has the rate_limit
	// member (null counts: no rule applied, so the request was allowed).
	Compared int64 `json:"compared"`
	// NewlyDenied were allowed in the log and are denied by the candidate;
	// NewlyAllowed the reverse.
	NewlyDenied  int64 `json:"newly_denied"`
	NewlyAllowed int64 `json:"newly_allowed"`
}

// RuleReport is one rule's part of a replay.
type RuleReport struct {
	ID string `json:"id"`
	// Scope is "envoy" or "fleet"; Shadow is true for a shadow rule.
	Scope  string `json:"scope"`
	Shadow bool   `json:"shadow,omitempty"`
	// Matched: requests the rule applies to (match holds, not exempt).
	Matched int64 `json:"matched"`
	// Allowed: matched requests the candidate admitted.
	Allowed int64 `json:"allowed"`
	// Denied: requests this rule denied (the rule the filter reported).
	Denied int64 `json:"denied"`
	// ShadowDenied: requests this shadow rule would have denied.
	ShadowDenied int64 `json:"shadow_denied"`
	// FirstDenial is the time of the first request this rule denied (or, for
	// a shadow rule, would have denied); nil when none.
	FirstDenial *time.Time `json:"first_denial"`
	// TopKeys are the counter keys with the most denials, most first.
	TopKeys []KeyCount `json:"top_keys"`
	// NewlyDenied: requests this rule denies that the log shows allowed.
	// NewlyAllowed: requests the log shows denied by this rule's id that the
	// candidate admits.
	NewlyDenied  int64 `json:"newly_denied"`
	NewlyAllowed int64 `json:"newly_allowed"`
	// PerMinute is allowed and denied per minute that has requests of the
	// rule, in order (for --plot): one entry per such minute, so its length
	// follows the lines, not the log's span. Not in the JSON output.
	PerMinute []MinuteCount `json:"-"`

	keys map[string]int64
}

// KeyCount is a counter key and its denials.
type KeyCount struct {
	Key    string `json:"key"`
	Denied int64  `json:"denied"`
}

// MinuteCount is one minute of a rule's decisions.
type MinuteCount struct {
	// Minute counts minutes from the log's first (0 is its first minute).
	Minute          int
	Allowed, Denied int64
}

// MaxGap is the longest a line's timestamp may be after the line before it, in
// timestamp order: a year. Lines further apart are not one stretch of traffic
// (a wrong clock, a stray line) and Replay refuses the run, naming the line;
// within it, the replay skips idle stretches, so its time and memory follow the
// lines, not the span.
const MaxGap = 365 * 24 * time.Hour

// Replay runs every request of lr, in timestamp order, through fresh Envoys
// running policy, on a virtual clock that follows the log, and reports per
// rule. The same logs and options give the same report. Errors: the filter
// does not start or fails, a log cannot be read, or a line is more than MaxGap
// after the line before it.
func Replay(ctx context.Context, wasm []byte, policy *rules.Policy, lr *LogReader, o ReplayOptions) (*Report, error) {
	o.Envoys = max(o.Envoys, 1)
	if o.TopKeys <= 0 {
		o.TopKeys = 10
	}
	// The log is read and decoded on another goroutine, a batch ahead, while
	// the filter decides: the order of the lines does not change.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := prefetch(ctx, lr)
	first, err := lines.next()
	if err == io.EOF {
		return emptyReport(policy, lr, o), nil
	}
	if err != nil {
		return nil, err
	}
	// Start on the log's first second, so windows align as Envoy's did.
	if o.Env == "" && rules.ValidName(first.Env) {
		o.Env = first.Env
	}
	f, err := NewFleet(ctx, Config{Wasm: wasm, Policy: policy, Envoys: o.Envoys, Workers: o.Workers, Env: o.Env,
		Start: first.Time.Truncate(time.Second)})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := newAccountant(f, first, o)
	if err := replayLines(ctx, f, lines, first, a); err != nil {
		return nil, err
	}
	return a.finish(f, lr)
}

// emptyReport is the report of a log without a request: every rule, nothing
// counted.
func emptyReport(policy *rules.Policy, lr *LogReader, o ReplayOptions) *Report {
	rep := &Report{Envoys: o.Envoys, LocalRules: localRules(o.Envoys), Skipped: lr.Skipped, FirstSkip: lr.FirstSkip, Rules: []RuleReport{}}
	for _, r := range policy.Rules {
		rep.Rules = append(rep.Rules, RuleReport{ID: r.ID, Scope: scopeOf(r), Shadow: r.Shadow, TopKeys: []KeyCount{}})
	}
	return rep
}

// replayLines sends every line from first on to f at its time, request by
// request or, where f can (one Envoy of one worker without fleet rules), in
// batches of many requests to a visit of the VM, and hands each decision to a.
// It refuses a line more than MaxGap after the one before it.
func replayLines(ctx context.Context, f *Fleet, lines *prefetched, first *LogLine, a *accountant) error {
	batch := 1
	if f.CanBatch() {
		batch = 256
	}
	ls := make([]*LogLine, 0, batch)
	rs := make([]Request, 0, batch)
	at := make([]time.Time, 0, batch)
	prev := first
	var err error
	for l := first; l != nil; {
		if err := ctx.Err(); err != nil {
			return err
		}
		ls, rs, at = ls[:0], rs[:0], at[:0]
		for l != nil && len(ls) < batch {
			if err := checkGap(prev, l); err != nil {
				return err
			}
			prev = l
			ls = append(ls, l)
			rs = append(rs, Request{Method: l.Method, Path: l.Path, Headers: l.Headers, ClientIP: validIP(l.ClientIP),
				Envoy: int((a.rep.Requests + int64(len(ls)) - 1) % int64(a.o.Envoys))})
			at = append(at, l.Time)
			if l, err = lines.next(); err == io.EOF {
				l = nil
			} else if err != nil {
				return err
			}
		}
		if batch > 1 {
			ds, err := f.DoAt(rs, at)
			if err != nil {
				return err
			}
			for i, d := range ds {
				a.account(ls[i], d)
			}
			continue
		}
		if err := f.AdvanceTo(at[0]); err != nil {
			return err
		}
		d, err := f.Do(rs[0])
		if err != nil {
			return err
		}
		a.account(ls[0], d)
	}
	return nil
}

// accountant builds a replay's report from the lines and their decisions.
type accountant struct {
	o           ReplayOptions
	rep         *Report
	c           *rules.Compiled
	index       map[string]int // rule id → index in rep.Rules
	startMinute int64          // the first line's minute since the Unix epoch
	// Scratch, reused line after line.
	matched []int
	req     rules.Request
	keyBuf  []byte
}

func newAccountant(f *Fleet, first *LogLine, o ReplayOptions) *accountant {
	c := f.Compiled()
	a := &accountant{o: o, c: c, index: map[string]int{}, startMinute: first.Time.Unix() / 60,
		rep:     &Report{Envoys: o.Envoys, LocalRules: localRules(o.Envoys), From: first.Time},
		matched: make([]int, 0, c.Len())}
	for i, r := range f.Policy().Rules {
		a.rep.Rules = append(a.rep.Rules, RuleReport{ID: r.ID, Scope: scopeOf(r), Shadow: r.Shadow, keys: map[string]int64{}})
		a.index[r.ID] = i
	}
	return a
}

// account counts line l, decided d: the request, the rules that count it, the
// rule that denied it (or would have, in shadow mode), and the difference from
// the decision logged with it.
func (a *accountant) account(l *LogLine, d Decision) {
	rep := a.rep
	rep.Requests++
	rep.To = l.Time
	if a.o.OnDecision != nil {
		a.o.OnDecision(l, d)
	}
	matched := a.match(l)
	denied := d.RateLimit != nil && d.RateLimit.RateLimited
	if denied {
		rep.Denied++
	} else {
		rep.Allowed++
	}
	minute := int(l.Time.Unix()/60 - a.startMinute)
	for _, i := range matched {
		r := &rep.Rules[i]
		r.Matched++
		if !denied {
			r.Allowed++
			r.minute(minute).Allowed++
		}
	}
	a.countDenial(l, d, matched, minute)
	a.compare(l, d, denied)
	if a.o.Progress != nil && rep.Requests&0xffff == 0 {
		a.o.Progress(rep.Requests)
	}
}

// match returns the rules that count l, with the filter's own matching code
// (a rule whose key cannot be formed for l does not count it).
func (a *accountant) match(l *LogLine) []int {
	a.req = rules.Request{Method: l.Method, Path: rules.PathOnly(l.Path), Headers: a.req.Headers[:0]}
	for _, h := range l.Headers {
		a.req.Headers = append(a.req.Headers, rules.Header{Name: h[0], Value: h[1]})
	}
	if ip := validIP(l.ClientIP); ip != "" {
		a.req.ClientIP, _ = netip.ParseAddr(ip)
	}
	a.matched, a.keyBuf = counting(a.c, &a.req, a.c.Match(&a.req, a.matched[:0]), a.keyBuf)
	return a.matched
}

// countDenial counts d's denial, or a shadow rule's that would have denied,
// against the rule its record names.
func (a *accountant) countDenial(l *LogLine, d Decision, matched []int, minute int) {
	rl := d.RateLimit
	if rl == nil || !rl.RateLimited && !rl.Shadow {
		return
	}
	rep := a.rep
	i, ok := a.index[rl.Rule]
	if ok && !rl.RateLimited && !rep.Rules[i].Shadow {
		// The record names an enforced rule; the shadow rule that would
		// have denied is the first matching one (the record names one rule).
		ok = false
		for _, m := range matched {
			if rep.Rules[m].Shadow {
				i, ok = m, true
				break
			}
		}
	}
	if !ok {
		return
	}
	r := &rep.Rules[i]
	if rl.RateLimited {
		r.Denied++
		r.minute(minute).Denied++
	} else {
		r.ShadowDenied++
	}
	if r.FirstDenial == nil {
		t := l.Time
		r.FirstDenial = &t
	}
	if rl.Rule == r.ID {
		r.keys[rl.Key]++
	}
}

// compare counts where d differs from the decision logged with l.
func (a *accountant) compare(l *LogLine, d Decision, denied bool) {
	lg := l.Logged
	if !l.HasLogged {
		return
	}
	rep := a.rep
	rep.Logged.Compared++
	wasDenied := lg != nil && lg.RateLimited
	switch {
	case denied && !wasDenied:
		rep.Logged.NewlyDenied++
		if i, ok := a.index[d.RateLimit.Rule]; ok {
			rep.Rules[i].NewlyDenied++
		}
	case !denied && wasDenied:
		rep.Logged.NewlyAllowed++
		if i, ok := a.index[lg.Rule]; ok {
			rep.Rules[i].NewlyAllowed++
		}
	}
}

// finish completes the report from the filter's metrics and the reader's
// skipped lines.
func (a *accountant) finish(f *Fleet, lr *LogReader) (*Report, error) {
	// Flush the filter's metrics (they go out on its tick) before reading them.
	if err := f.FlushMetrics(); err != nil {
		return nil, err
	}
	rep := a.rep
	rep.Overflows = f.Metric("sluice.bucket_overflow")
	for i := range rep.Rules {
		if r := &rep.Rules[i]; r.Shadow {
			// The filter counts every shadow rule that would have denied, also
			// where its record named another rule.
			r.ShadowDenied = int64(f.Metric("sluice.rule." + r.ID + ".shadow_limited"))
		}
	}
	rep.Skipped, rep.FirstSkip = lr.Skipped, lr.FirstSkip
	for i := range rep.Rules {
		rep.Rules[i].TopKeys = topKeys(rep.Rules[i].keys, a.o.TopKeys)
	}
	return rep, nil
}

// prefetched hands out the lines a reading goroutine decoded ahead.
type prefetched struct {
	ch    <-chan lineBatch
	batch []*LogLine
	err   error
}

type lineBatch struct {
	lines []*LogLine
	err   error // after the last batch: io.EOF or the read error
}

// prefetch starts reading lr in batches of 512 lines, at most 8 batches ahead.
func prefetch(ctx context.Context, lr *LogReader) *prefetched {
	ch := make(chan lineBatch, 8)
	go func() {
		defer close(ch)
		for {
			b := lineBatch{lines: make([]*LogLine, 0, 512)}
			for len(b.lines) < cap(b.lines) {
				l, err := lr.Next()
				if err != nil {
					b.err = err
					break
				}
				b.lines = append(b.lines, l)
			}
			select {
			case ch <- b:
			case <-ctx.Done():
				return
			}
			if b.err != nil {
				return
			}
		}
	}()
	return &prefetched{ch: ch}
}

// next returns the next line, io.EOF after the last, or the read error.
func (p *prefetched) next() (*LogLine, error) {
	for len(p.batch) == 0 {
		if p.err != nil {
			return nil, p.err
		}
		b, ok := <-p.ch
		if !ok {
			return nil, io.EOF
		}
		p.batch, p.err = b.lines, b.err
	}
	l := p.batch[0]
	p.batch = p.batch[1:]
	return l, nil
}

// minute returns the rule's count for minute m (from the log's first); minutes
// come in order, so a new one is appended.
func (r *RuleReport) minute(m int) *MinuteCount {
	m = max(m, 0)
	if n := len(r.PerMinute); n == 0 || r.PerMinute[n-1].Minute < m {
		r.PerMinute = append(r.PerMinute, MinuteCount{Minute: m})
	}
	return &r.PerMinute[len(r.PerMinute)-1]
}

// counting keeps, of the rules matched (indices into c), those that count req:
// a rule that cannot form its key for the request (a per-user rule and no user)
// does not count it, in the filter as here. buf is scratch for the keys, returned
// for reuse.
func counting(c *rules.Compiled, req *rules.Request, matched []int, buf []byte) ([]int, []byte) {
	kept := matched[:0]
	for _, i := range matched {
		var ok bool
		if buf, ok = c.AppendKey(buf[:0], i, req); ok {
			kept = append(kept, i)
		}
	}
	return kept, buf
}

// checkGap refuses l when it is more than MaxGap after prev.
func checkGap(prev, l *LogLine) error {
	if gap := l.Time.Sub(prev.Time); gap > MaxGap {
		return fmt.Errorf("lab: %s:%d: timestamp %s is more than a year after the line before it (%s:%d, %s): lines that far apart are not one stretch of traffic; remove the line or replay the parts apart",
			l.File, l.Line, l.Time.UTC().Format(time.RFC3339), prev.File, prev.Line, prev.Time.UTC().Format(time.RFC3339))
	}
	return nil
}

func topKeys(m map[string]int64, n int) []KeyCount {
	out := make([]KeyCount, 0, len(m))
	for k, v := range m {
		out = append(out, KeyCount{Key: k, Denied: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Denied != out[j].Denied {
			return out[i].Denied > out[j].Denied
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

func localRules(envoys int) string {
	if envoys == 1 {
		return "one envoy"
	}
	return "per envoy"
}

func scopeOf(r rules.Rule) string {
	if r.Scope == rules.ScopeFleet {
		return rules.ScopeFleet
	}
	return rules.ScopeEnvoy
}

// validIP returns s when it is an IP address, else "" (the filter then keys
// on the lab's default client address).
func validIP(s string) string {
	if _, err := netip.ParseAddr(s); err != nil {
		return ""
	}
	return s
}
