package redisstore

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/store/storetest"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

func TestConformance(t *testing.T) {
	srv := redisproc.Start(t, redisproc.Options{})
	storetest.Run(t, func(t *testing.T) store.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		if err := c.FlushAll(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
		s, err := Open(Options{URL: srv.URL(), HistoryDepth: storetest.Depth})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestUniversalOptions(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		addrs  []string
		user   string
		pass   string
		db     int
		tls    bool
		master string
	}{
		{"url", Options{URL: "redis://u:p@h:1/3"}, []string{"h:1"}, "u", "p", 3, false, ""},
		{"tls", Options{URL: "rediss://h:1"}, []string{"h:1"}, "", "", 0, true, ""},
		{"cluster", Options{URL: "a:1, b:2,c:3"}, []string{"a:1", "b:2", "c:3"}, "", "", 0, false, ""},
		{"sentinel", Options{URL: "redis://:pw@s1:26379,s2:26379", MasterName: "m"}, []string{"s1:26379", "s2:26379"}, "", "pw", 0, false, "m"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := tc.opts.UniversalOptions()
			if err != nil {
				t.Fatal(err)
			}
			if len(u.Addrs) != len(tc.addrs) {
				t.Fatalf("Addrs = %v, want %v", u.Addrs, tc.addrs)
			}
			for i := range u.Addrs {
				if u.Addrs[i] != tc.addrs[i] {
					t.Fatalf("Addrs = %v, want %v", u.Addrs, tc.addrs)
				}
			}
			if u.Username != tc.user || u.Password != tc.pass || u.DB != tc.db || (u.TLSConfig != nil) != tc.tls || u.MasterName != tc.master {
				t.Fatalf("options = %+v", u)
			}
		})
	}
	for _, bad := range []string{"", " , ", "nohost", "http://x:1", "redis://h:1/notadb"} {
		if _, err := (Options{URL: bad}).UniversalOptions(); err == nil {
			t.Errorf("UniversalOptions(%q) succeeded, want error", bad)
		}
	}
}

// TestWaitReplicas: with WaitReplicas a commit is acknowledged only once
// that many replicas confirmed it (Redis WAIT); with none connected the
// commit is reported as an error although the master applied it, and a
// version conflict is still ErrConflict.
func TestWaitReplicas(t *testing.T) {
	ctx := t.Context()
	master := redisproc.Start(t, redisproc.Options{})
	s, err := Open(Options{URL: master.URL(), HistoryDepth: 3, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := store.Change{Name: "p", Base: 0, Doc: []byte(`{"v":1}`), Op: store.OpPutPolicy, Time: time.Now(), ID: "a"}
	if _, err := s.Commit(ctx, c); !errors.Is(err, errTooFewReplicas) {
		t.Fatalf("commit without a replica: err %v, want %v", err, errTooFewReplicas)
	}
	if r, _ := s.Get(ctx, "p"); r.Version != 1 {
		t.Fatalf("the master did not apply the unconfirmed commit: %+v", r)
	}

	replica := redisproc.Start(t, redisproc.Options{})
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer rc.Close()
	host, port, _ := net.SplitHostPort(master.Addr())
	if err := rc.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, _ := mc.Info(ctx, "replication").Result()
		if strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never came online:\n%s", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// With the replica online, a store whose WAIT timeout leaves a loaded
	// machine time to replicate (100 ms was too tight beside a busy test
	// suite on two cores).
	s2, err := Open(Options{URL: master.URL(), HistoryDepth: 3, WaitReplicas: 1, WaitTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	c = store.Change{Name: "p", Base: 1, Doc: []byte(`{"v":2}`), Op: store.OpPutPolicy, Time: time.Now(), ID: "b"}
	r, err := s2.Commit(ctx, c)
	if err != nil || r.Version != 2 {
		t.Fatalf("commit with a replica = %+v, %v", r, err)
	}
	if got, _ := rc.Get(ctx, "sluice:policy:{p}:version").Result(); got != "2" {
		t.Fatalf("the replica has version %q after the acknowledged commit, want 2", got)
	}
	c.Base, c.ID = 0, "c"
	if _, err := s2.Commit(ctx, c); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale commit err %v, want ErrConflict", err)
	}

	if _, err := Open(Options{URL: master.URL(), HistoryDepth: 3, WaitReplicas: 1, WaitTimeout: 3 * time.Second}); err == nil {
		t.Fatal("Open accepted a wait timeout above the operation timeout")
	}
	if _, err := Open(Options{URL: "a:1,b:2", HistoryDepth: 3, WaitReplicas: 1}); err == nil {
		t.Fatal("Open accepted WAIT on a Cluster")
	}
}
