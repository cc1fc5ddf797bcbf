package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// tally counts one rule's decisions.
type tally struct{ allowed, limited int }

// decisions follows access logs and counts each rule's decisions from the
// rate_limit field (the filter state the filter writes), so that make run shows
// what the limiter does while you try it.
type decisions struct {
	files   []string
	offsets []int64
	partial [][]byte
}

func newDecisions(files ...string) *decisions {
	d := &decisions{files: files, offsets: make([]int64, len(files)), partial: make([][]byte, len(files))}
	for i, f := range files { // count from now on, not the previous runs' lines
		if fi, err := os.Stat(f); err == nil {
			d.offsets[i] = fi.Size()
		}
	}
	return d
}

// read returns the decisions logged since the last call, per rule.
func (d *decisions) read() map[string]*tally {
	out := map[string]*tally{}
	for i, name := range d.files {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		if _, err := f.Seek(d.offsets[i], io.SeekStart); err == nil {
			b, _ := io.ReadAll(f)
			d.offsets[i] += int64(len(b))
			b = append(d.partial[i], b...)
			end := bytes.LastIndexByte(b, '\n')
			d.partial[i] = append([]byte(nil), b[end+1:]...)
			for _, line := range bytes.Split(b[:end+1], []byte("\n")) {
				countLine(line, out)
			}
		}
		f.Close()
	}
	return out
}

func countLine(line []byte, out map[string]*tally) {
	var entry struct {
		RateLimit *string `json:"rate_limit"`
	}
	if json.Unmarshal(line, &entry) != nil || entry.RateLimit == nil {
		return
	}
	var st struct {
		RateLimited bool   `json:"rate_limited"`
		Rule        string `json:"rule"`
	}
	if json.Unmarshal([]byte(*entry.RateLimit), &st) != nil || st.Rule == "" {
		return
	}
	t := out[st.Rule]
	if t == nil {
		t = &tally{}
		out[st.Rule] = t
	}
	if st.RateLimited {
		t.limited++
	} else {
		t.allowed++
	}
}

// format renders one line: "rule a allowed / l limited", rules sorted.
func format(counts map[string]*tally) string {
	rules := make([]string, 0, len(counts))
	for r := range counts {
		rules = append(rules, r)
	}
	sort.Strings(rules)
	parts := make([]string, len(rules))
	for i, r := range rules {
		parts[i] = fmt.Sprintf("%s %d allowed / %d limited", r, counts[r].allowed, counts[r].limited)
	}
	return strings.Join(parts, "; ")
}

// report prints, every interval in which requests were decided, a line with each
// rule's counts, until done is closed.
func (d *decisions) report(every time.Duration, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if c := d.read(); len(c) > 0 {
				fmt.Fprintf(os.Stderr, "==> last %s: %s\n", every, format(c))
			}
		}
	}
}
