package grpcauth

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRefusalsAreLoggedAtMostOncePerIntervalWithTheCountBetween(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(1000, 0)
	r := &RefusalLog{Every: 10 * time.Second, now: func() time.Time { return now }}
	err := errors.New("the bearer token is not the quota token")
	for range 5 {
		r.Note(context.Background(), log, "a RateLimitService call", err)
		now = now.Add(time.Second)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), "not the quota token") {
		t.Fatalf("5 refusals within 10 s logged %d lines:\n%s", n, buf.String())
	}
	now = now.Add(10 * time.Second)
	r.Note(context.Background(), log, "a RateLimitService call", err)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "more_refused_since_last_line=4") {
		t.Fatalf("after the interval: %q, want a second line counting the 4 not logged", lines)
	}
}
