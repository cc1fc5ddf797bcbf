package grpcauth

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/peer"
)

// RefusalLog logs calls refused by Owner, at most one line per Every (default
// 10 s) with how many more were refused since the last line, so that a wrong
// quota token or a missing client certificate, which turns limiting off for
// every request of the Envoy that has it, is seen in the log and not only in
// a counter, without a line per request. The zero value is ready to use.
type RefusalLog struct {
	// Every is the shortest time between two lines (0: 10 s).
	Every time.Duration

	now        func() time.Time // time.Now but for tests
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Note logs err, the refusal of a call of ctx (its peer's address named),
// unless a line was written within Every; then it only counts it.
func (r *RefusalLog) Note(ctx context.Context, log *slog.Logger, what string, err error) {
	every := r.Every
	if every <= 0 {
		every = 10 * time.Second
	}
	clock := r.now
	if clock == nil {
		clock = time.Now
	}
	now := clock()
	r.mu.Lock()
	if !r.last.IsZero() && now.Sub(r.last) < every {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	more := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	from := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		from = p.Addr.String()
	}
	log.Warn(what+" refused: the caller is not authenticated, and its requests are not limited", "peer", from, "err", err,
		"more_refused_since_last_line", more, "every", every.String())
}
