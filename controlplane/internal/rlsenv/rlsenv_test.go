package rlsenv

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

func TestAVariableThatWouldChangeAnswersIsRefusedByName(t *testing.T) {
	for _, c := range []struct{ env, value, want string }{
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_RESPONSE_HEADERS_ENABLED"},
		{"REDIS_PERSECOND", "true", "REDIS_PERSECOND"},
		{"BACKEND_TYPE", "memcache", "BACKEND_TYPE"},
		{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "maybe", "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{"CONFIG_TYPE", "CONSUL", "CONFIG_TYPE"},
		{"REDIS_TYPE", "twemproxy", "REDIS_TYPE"},
		{"REDIS_SOCKET_TYPE", "udp", "REDIS_SOCKET_TYPE"},
		{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "CREATE", "REDIS_POOL_ON_EMPTY_BEHAVIOR"},
		{"LOG_LEVEL", "loud", "LOG_LEVEL"},
		{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT"},
		{"PORT", "eighty", "PORT"}, // envconfig's own message names it
	} {
		t.Run(c.env+"="+c.value, func(t *testing.T) {
			t.Setenv(c.env, c.value)
			_, err := Read()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Read: %v, want an error naming %s", err, c.want)
			}
		})
	}
}

func TestMetricsOnlyVariablesAreNotedNotRefused(t *testing.T) {
	t.Setenv("USE_STATSD", "true")
	t.Setenv("STATSD_HOST", "statsd")
	t.Setenv("NEAR_LIMIT_RATIO", "0.9")
	t.Setenv("TRACING_ENABLED", "true")
	t.Setenv("REDIS_URL", "127.0.0.1:6379") // served: not noted
	s, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.Noted, "\n")
	for _, name := range []string{"USE_STATSD (", "STATSD_HOST (", "NEAR_LIMIT_RATIO (", "TRACING_ENABLED ("} {
		if !strings.Contains(got, name) {
			t.Errorf("noted:\n%s\nlacks %s", got, name)
		}
	}
	if strings.Contains(got, "REDIS_URL") {
		t.Errorf("a served variable noted:\n%s", got)
	}
}

func TestTheDefaultsAreEnvoyproxyRatelimits(t *testing.T) {
	s, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if s.HTTPAddr() != "0.0.0.0:8080" || s.GRPCAddr() != "0.0.0.0:8081" || s.DebugAddr() != "0.0.0.0:6070" {
		t.Errorf("listeners %s %s %s", s.HTTPAddr(), s.GRPCAddr(), s.DebugAddr())
	}
	if dir, app := s.Dir(); dir != "/srv/runtime_data/current" || !app || s.RuntimeAppDirectory != "config" {
		t.Errorf("dir %q app only %v", dir, app)
	}
	if s.RedisSocketType != "unix" || s.RedisURL != "/var/run/nutcracker/ratelimit.sock" || s.RedisPoolSize != 10 {
		t.Errorf("redis %s %s %d", s.RedisSocketType, s.RedisURL, s.RedisPoolSize)
	}
	t.Setenv("RUNTIME_ROOT", "/data")
	t.Setenv("RUNTIME_SUBDIRECTORY", "ratelimit")
	t.Setenv("RUNTIME_WATCH_ROOT", "false")
	if s, err = Read(); err != nil {
		t.Fatal(err)
	}
	if dir, app := s.Dir(); dir != "/data/ratelimit/config" || app {
		t.Errorf("RUNTIME_WATCH_ROOT=false: dir %q app only %v, want /data/ratelimit/config", dir, app)
	}
}

func TestRedisURLIsReadAsEnvoyproxyRatelimitReadsIt(t *testing.T) {
	for _, c := range []struct {
		typ, url, auth string
		addrs          []string
		master, user   string
		pass           string
		cluster        bool
	}{
		{"SINGLE", "redis:6379", "secret", []string{"redis:6379"}, "", "", "secret", false},
		{"cluster", "a:7000,b:7001,c:7002", "", []string{"a:7000", "b:7001", "c:7002"}, "", "", "", true},
		{"SENTINEL", "mymaster,s1:26379,s2:26379", "alice:pw", []string{"s1:26379", "s2:26379"}, "mymaster", "alice", "pw", false},
	} {
		t.Setenv("REDIS_TYPE", c.typ)
		t.Setenv("REDIS_URL", c.url)
		t.Setenv("REDIS_AUTH", c.auth)
		s, err := Read()
		if err != nil {
			t.Fatal(err)
		}
		o, err := s.RedisOptions()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(o.Addrs, ",") != strings.Join(c.addrs, ",") || o.MasterName != c.master || o.Username != c.user ||
			o.Password != c.pass || o.IsClusterMode != c.cluster {
			t.Errorf("%s %s: %+v", c.typ, c.url, o)
		}
	}
	t.Setenv("REDIS_TYPE", "SENTINEL")
	t.Setenv("REDIS_URL", "mymaster")
	s, _ := Read()
	if _, err := s.RedisOptions(); err == nil || !strings.Contains(err.Error(), "REDIS_URL") {
		t.Errorf("a sentinel URL without sentinels: %v", err)
	}
}

// TestAUnixSocketRedisIsDialedOverTheSocket: REDIS_SOCKET_TYPE's default,
// unix, reaches a real redis-server on its socket.
func TestAUnixSocketRedisIsDialedOverTheSocket(t *testing.T) {
	rs := redisproc.Start(t, redisproc.Options{UnixSocket: true})
	t.Setenv("REDIS_URL", rs.Socket())
	client := clientOfEnv(t)
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING over %s: %v", rs.Socket(), err)
	}
}

// TestAClusterRedisIsReachedThroughItsNodes: REDIS_TYPE=CLUSTER with the
// nodes comma-separated reaches a real three-node Redis Cluster, keys of
// every slot range written and read back.
func TestAClusterRedisIsReachedThroughItsNodes(t *testing.T) {
	c := redisproc.StartCluster(t)
	t.Setenv("REDIS_SOCKET_TYPE", "tcp")
	t.Setenv("REDIS_TYPE", "CLUSTER")
	t.Setenv("REDIS_URL", strings.Join(c.Addrs(), ","))
	client := clientOfEnv(t)
	ctx := context.Background()
	for i := range 30 {
		k := "k" + string(rune('a'+i%26)) + string(rune('0'+i/26))
		if err := client.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if v, err := client.Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("GET %s: %v %v", k, v, err)
		}
	}
}

// clientOfEnv is the go-redis client of the environment's REDIS_* variables,
// closed when the test ends.
func clientOfEnv(t *testing.T) redis.UniversalClient {
	t.Helper()
	s, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewUniversalClient(o)
	t.Cleanup(func() { client.Close() })
	return client
}
