package config

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/version"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func files(m map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if v, ok := m[p]; ok {
			return []byte(v), nil
		}
		return nil, os.ErrNotExist
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		files map[string]string
		check func(t *testing.T, s Settings)
	}{
		{"defaults on loopback without tokens", nil, nil, nil, func(t *testing.T, s Settings) {
			if s.Listen != "127.0.0.1:8080" || s.DataDir != "sluice-data" || s.RedisURL != "" || s.HistoryDepth != 50 ||
				s.MaxWait != 60*time.Second || s.MaxBodyBytes != 1<<20+64<<10 || s.ResyncInterval != 2*time.Second ||
				s.LogLevel != "info" || s.LogFormat != "json" || s.AdminToken != "" {
				t.Fatalf("defaults = %+v", s)
			}
		}},
		{"env", nil, map[string]string{
			"SLUICE_LISTEN": "0.0.0.0:9000", "SLUICE_ADMIN_TOKEN": "a", "SLUICE_READ_TOKEN": "r",
			"SLUICE_REDIS_URL": "redis://h:1", "SLUICE_REDIS_MASTER_NAME": "m", "SLUICE_HISTORY_DEPTH": "7",
			"SLUICE_MAX_WAIT": "90s", "SLUICE_MAX_BODY_BYTES": "4096", "SLUICE_RESYNC_INTERVAL": "500ms",
		}, nil, func(t *testing.T, s Settings) {
			if s.Listen != "0.0.0.0:9000" || s.AdminToken != "a" || s.ReadToken != "r" || s.RedisURL != "redis://h:1" ||
				s.RedisMasterName != "m" || s.HistoryDepth != 7 || s.MaxWait != 90*time.Second || s.MaxBodyBytes != 4096 ||
				s.ResyncInterval != 500*time.Millisecond {
				t.Fatalf("from env = %+v", s)
			}
		}},
		{"flags win over env", []string{"--listen", "127.0.0.1:1", "--history-depth=3"},
			map[string]string{"SLUICE_LISTEN": "0.0.0.0:2", "SLUICE_HISTORY_DEPTH": "9"}, nil,
			func(t *testing.T, s Settings) {
				if s.Listen != "127.0.0.1:1" || s.HistoryDepth != 3 {
					t.Fatalf("flags = %+v", s)
				}
			}},
		{"token files, trimmed", []string{"--admin-token-file", "/a", "--listen", ":8080", "--quota-token-file", "/q"},
			map[string]string{"SLUICE_READ_TOKEN_FILE": "/r"}, map[string]string{"/a": "adm\n", "/r": " rd ", "/q": "qt\n"},
			func(t *testing.T, s Settings) {
				if s.AdminToken != "adm" || s.ReadToken != "rd" || s.QuotaToken != "qt" {
					t.Fatalf("tokens %q %q %q", s.AdminToken, s.ReadToken, s.QuotaToken)
				}
			}},
		{"localhost without tokens", []string{"--listen", "localhost:0"}, nil, nil, func(t *testing.T, s Settings) {}},
		{"ipv6 loopback without tokens", []string{"--listen", "[::1]:0"}, nil, nil, func(t *testing.T, s Settings) {}},
		{"read token alone on a public address", []string{"--listen", ":0"}, map[string]string{"SLUICE_READ_TOKEN": "r"}, nil,
			func(t *testing.T, s Settings) {}},
		{"xfcc on loopback without a quota token", []string{"--trust-xfcc", "--grpc-listen", "127.0.0.1:0"}, nil, nil,
			func(t *testing.T, s Settings) {}},
		{"xfcc on the network with a quota token", []string{"--trust-xfcc", "--listen", "0.0.0.0:0", "--grpc-listen", "0.0.0.0:0"},
			map[string]string{"SLUICE_ADMIN_TOKEN": "a", "SLUICE_QUOTA_TOKEN": "q"}, nil, func(t *testing.T, s Settings) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.args, env(tc.env), files(tc.files), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no tokens on all interfaces", []string{"--listen", ":8080"}, nil, "refusing to serve an unauthenticated API"},
		{"no tokens on a public IP", []string{"--listen", "192.0.2.1:8080"}, nil, "refusing"},
		{"no tokens on 0.0.0.0 from env", nil, map[string]string{"SLUICE_LISTEN": "0.0.0.0:8080"}, "refusing"},
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, nil, "unexpected argument"},
		{"bad duration in env", nil, map[string]string{"SLUICE_MAX_WAIT": "soon"}, "SLUICE_MAX_WAIT"},
		{"bad depth", []string{"--history-depth", "0"}, nil, "--history-depth"},
		{"tiny max wait", []string{"--max-wait", "1ms"}, nil, "--max-wait"},
		{"bad listen", []string{"--listen", "nowhere"}, nil, "--listen"},
		{"token and token file", []string{"--admin-token-file", "/a"}, map[string]string{"SLUICE_ADMIN_TOKEN": "x"}, "both"},
		{"missing token file", []string{"--read-token-file", "/missing"}, nil, "--read-token-file"},
		{"quota token and quota token file", []string{"--quota-token-file", "/a"}, map[string]string{"SLUICE_QUOTA_TOKEN": "x"}, "both"},
		{"same tokens", nil, map[string]string{"SLUICE_ADMIN_TOKEN": "x", "SLUICE_READ_TOKEN": "x"}, "must differ"},
		{"master without url", []string{"--redis-master-name", "m"}, nil, "--redis-master-name"},
		{"wait without url", []string{"--redis-wait-replicas", "1"}, nil, "--redis-wait-replicas needs"},
		{"negative wait", []string{"--redis-url", "redis://h:1", "--redis-wait-replicas", "-1"}, nil, "--redis-wait-replicas"},
		{"long wait timeout", []string{"--redis-url", "redis://h:1", "--redis-wait-replicas", "1", "--redis-wait-timeout", "5s"}, nil, "--redis-wait-timeout"},
		{"log level", []string{"--log-level", "loud"}, nil, "--log-level"},
		{"log format", []string{"--log-format", "xml"}, nil, "--log-format"},
		{"no policies allowed", []string{"--max-policies", "0"}, nil, "--max-policies"},
		{"too many policies allowed", nil, map[string]string{"SLUICE_MAX_POLICIES": "1000000"}, "--max-policies"},
		{"cert without key", []string{"--tls-cert-file", "/c"}, nil, "--tls-cert-file and --tls-key-file go together"},
		{"key without cert", nil, map[string]string{"SLUICE_TLS_KEY_FILE": "/k"}, "go together"},
		{"client CA without TLS", []string{"--client-ca-file", "/ca"}, nil, "--client-ca-file needs --tls-cert-file"},
		{"two identity sources", []string{"--tls-cert-file", "/c", "--tls-key-file", "/k", "--client-ca-file", "/ca", "--trust-xfcc"}, nil, "use one"},
		{"no entries per identity", []string{"--quota-max-entries-per-identity", "0"}, nil, "--quota-max-entries-per-identity"},
		{"reset with redis", []string{"--reset-damaged-store", "--redis-url", "redis://127.0.0.1:6379"}, nil, "--reset-damaged-store"},
		{"grpc without port", []string{"--grpc-listen", "127.0.0.1"}, nil, "--grpc-listen"},
		{"open grpc on the network", []string{"--grpc-listen", "0.0.0.0:8081"}, map[string]string{"SLUICE_ADMIN_TOKEN": "a"}, "needs --quota-token or --client-ca-file"},
		{"xfcc without a quota token on the network", []string{"--listen", "0.0.0.0:8080", "--trust-xfcc"}, map[string]string{"SLUICE_ADMIN_TOKEN": "a"}, "--trust-xfcc without --quota-token on the non-loopback listener 0.0.0.0:8080"},
		{"xfcc without a quota token on a network grpc listener", []string{"--grpc-listen", "0.0.0.0:8081", "--trust-xfcc"}, map[string]string{"SLUICE_ADMIN_TOKEN": "a"}, "non-loopback listener 0.0.0.0:8081"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args, env(tc.env), files(nil), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]string{"--listen", ":1"}, env(nil), files(nil), io.Discard); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("err = %v, want ErrNoTokens", err)
	}
	if _, err := Parse([]string{"-h"}, env(nil), files(nil), io.Discard); !errors.Is(err, ErrHelp) {
		t.Fatalf("-h err = %v, want ErrHelp", err)
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("admin-token-file"); got != "SLUICE_ADMIN_TOKEN_FILE" {
		t.Fatal(got)
	}
}

// TestVersionPrintsTheReleaseAndStops: --version prints the binary's name and the
// release set at link time, and no environment variable turns it on.
func TestVersionPrintsTheReleaseAndStops(t *testing.T) {
	old := version.Version
	version.Version = "v9.8.7"
	defer func() { version.Version = old }()
	var out strings.Builder
	_, err := Parse([]string{"--version"}, func(string) string { return "" }, nil, &out)
	if !errors.Is(err, ErrVersion) || !strings.HasPrefix(out.String(), "sluice-controlplane v9.8.7 (") {
		t.Fatalf("--version: %v, %q", err, out.String())
	}
	out.Reset()
	env := map[string]string{"SLUICE_VERSION": "true"}
	if _, err := Parse([]string{"--listen", "127.0.0.1:0"}, func(k string) string { return env[k] }, nil, &out); err != nil || out.Len() > 0 {
		t.Fatalf("SLUICE_VERSION=true: %v, %q", err, out.String())
	}
}

// TestRequireIdentityRefusesTokenOnlyMode: with --require-identity the control
// plane starts only where it can tell Envoys apart (a client CA or a trusted
// sidecar), and the refusal names both ways.
func TestRequireIdentityRefusesTokenOnlyMode(t *testing.T) {
	env := func(string) string { return "" }
	files := func(name string) ([]byte, error) { return []byte("x"), nil }
	_, err := Parse([]string{"--listen", "0.0.0.0:8080", "--admin-token", "a", "--quota-token", "q", "--require-identity"}, env, files, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--client-ca-file") || !strings.Contains(err.Error(), "--trust-xfcc") {
		t.Fatalf("token-only with --require-identity: %v", err)
	}
	if _, err := Parse([]string{"--listen", "0.0.0.0:8080", "--admin-token", "a", "--quota-token", "q", "--require-identity", "--trust-xfcc"}, env, files, io.Discard); err != nil {
		t.Fatalf("--trust-xfcc satisfies it: %v", err)
	}
	if _, err := Parse([]string{"--listen", "0.0.0.0:8080", "--admin-token", "a", "--quota-token", "q"}, env, files, io.Discard); err != nil {
		t.Fatalf("without the flag token-only still starts (with its warning): %v", err)
	}
}
