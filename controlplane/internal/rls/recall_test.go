package rls

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// TestRecallsReachTheOtherReplicasOnRedisAndOnACluster: a recall published by
// one client reaches a subscriber on another client of the same Redis; on a
// Redis Cluster, between two cluster clients, and from a client of one node
// to a subscriber on another node. The clients are tuned as the quota
// service's are.
func TestRecallsReachTheOtherReplicasOnRedisAndOnACluster(t *testing.T) {
	client := func(addrs ...string) redis.UniversalClient {
		o := &redis.UniversalOptions{Addrs: addrs, IsClusterMode: len(addrs) > 1}
		quota.TuneClient(o)
		c := redis.NewUniversalClient(o)
		t.Cleanup(func() { c.Close() })
		return c
	}
	single := redisproc.Start(t).Addr()
	cluster := redisproc.StartCluster(t).Addrs()
	for _, c := range []struct {
		name     string
		pub, sub redis.UniversalClient
	}{
		{"redis", client(single), client(single)},
		{"cluster", client(cluster[0], cluster[1], cluster[2]), client(cluster[2], cluster[1], cluster[0])},
		{"cluster nodes", client(cluster[0]), client(cluster[2])},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got := make(chan string, 1)
			if err := (RedisRecalls{Client: c.sub}).Subscribe(ctx, func(msg string) { got <- msg }); err != nil {
				t.Fatal(err)
			}
			if err := (RedisRecalls{Client: c.pub}).Publish(ctx, "rls:a\nkey"); err != nil {
				t.Fatal(err)
			}
			select {
			case msg := <-got:
				if msg != "rls:a\nkey" {
					t.Errorf("received %q", msg)
				}
			case <-ctx.Done():
				t.Fatal("no recall received")
			}
		})
	}
}
