package rls

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Recalls carry between the replicas on one store a replica's request that the
// other holders of a key give back the units their leases hold. A replica
// publishes one when an ask short of units learns that other leases hold some
// (quota.AssignResult.HeldElsewhere); a replica holding units of that key
// returns them at once, and its calls on the key ask for what they need from
// then on. docs/rls.md, "Leases".
type Recalls interface {
	// Publish sends a recall: msg is the recalling replica's ledger entry and
	// the counter key, separated by a newline. Errors: the transport's.
	Publish(ctx context.Context, msg string) error
	// Subscribe subscribes, then calls recall with every recall published
	// (this replica's own included) until ctx ends. Errors: the subscription
	// could not be made.
	Subscribe(ctx context.Context, recall func(msg string)) error
}

// RecallChannel is the Redis pub/sub channel RedisRecalls use.
const RecallChannel = "sluice:rls:recall"

// RedisRecalls are Recalls over Redis pub/sub (PUBLISH and SUBSCRIBE on
// RecallChannel; on a Redis Cluster a message published on any node reaches
// the subscribers of every node). The client resubscribes after a lost
// connection; recalls published meanwhile are lost, and the calls that sent
// them wait their bounded time and are answered as without a recall.
type RedisRecalls struct{ Client redis.UniversalClient }

// Publish implements Recalls.
func (r RedisRecalls) Publish(ctx context.Context, msg string) error {
	return r.Client.Publish(ctx, RecallChannel, msg).Err()
}

// Subscribe implements Recalls.
func (r RedisRecalls) Subscribe(ctx context.Context, recall func(msg string)) error {
	ps := r.Client.Subscribe(ctx, RecallChannel)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return err
	}
	go func() {
		defer ps.Close()
		ch := ps.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				recall(m.Payload)
			}
		}
	}()
	return nil
}

// publishRecall asks the other holders of key to give back what their leases
// hold (Options.Recalls), in the background and within maxHeldWait (a recall
// later than that finds no call waiting for it): a store that does not answer
// delays no call (at most about maxHeldWait/heldPoll publishes of a key whose
// calls wait are then in flight).
func (s *Server) publishRecall(key string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), maxHeldWait)
		defer cancel()
		if err := s.o.Recalls.Publish(ctx, s.entry+"\n"+key); err != nil {
			s.m.recalls.WithLabelValues("failed").Inc()
			s.warn("recall", "rls: a recall could not be published", "key", key, "err", err)
			return
		}
		s.m.recalls.WithLabelValues("published").Inc()
	}()
}

// recall answers a recall another replica published: the units this
// replica's lease of the key holds are returned at once (by a report in the
// background, as a refill is made), and its calls on the key ask for what
// they need from then on. A lease with an ask in flight is left alone: the
// recalling replica asks again within heldPoll, and recalls again.
func (s *Server) recall(msg string) {
	from, key, ok := strings.Cut(msg, "\n")
	if !ok || from == s.entry {
		return
	}
	s.leases.mu.Lock()
	l := s.leases.m[key]
	s.leases.mu.Unlock()
	if l == nil {
		return
	}
	now := s.o.Now()
	l.mu.Lock()
	if l.rule == nil || l.units == 0 || l.asking != nil || now >= l.end {
		l.mu.Unlock()
		return
	}
	l.stale += l.units // returned by the next ask
	l.units, l.exact = 0, true
	l.asking = make(chan struct{})
	fr := l.rule
	l.mu.Unlock()
	s.m.recalls.WithLabelValues("returned").Inc()
	s.refill(refillJob{fr: fr, key: key, l: l})
}

// subscribeRecalls subscribes to the recalls, again every second while the
// subscription cannot be made, until ctx ends.
func (s *Server) subscribeRecalls(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		err := s.o.Recalls.Subscribe(ctx, s.recall)
		if err == nil {
			return
		}
		s.warn("recall", "rls: cannot subscribe to recalls; retrying every second", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
