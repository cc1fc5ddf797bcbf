package config

import (
	"io"
	"strings"
	"testing"
)

func TestQuotaTokenFlagAndEnv(t *testing.T) {
	s, err := Parse([]string{"--quota-token", "q"}, env(nil), nil, io.Discard)
	if err != nil || s.QuotaToken != "q" {
		t.Fatalf("flag: %q %v", s.QuotaToken, err)
	}
	s, err = Parse(nil, env(map[string]string{"SLUICE_QUOTA_TOKEN": "qe"}), nil, io.Discard)
	if err != nil || s.QuotaToken != "qe" {
		t.Fatalf("env: %q %v", s.QuotaToken, err)
	}
	for _, args := range [][]string{
		{"--quota-token", "x", "--admin-token", "x"},
		{"--quota-token", "x", "--read-token", "x"},
	} {
		if _, err := Parse(args, env(nil), nil, io.Discard); err == nil || !strings.Contains(err.Error(), "quota token must differ") {
			t.Fatalf("%v: %v", args, err)
		}
	}
}
