package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/redistest"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/controlplane/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
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
