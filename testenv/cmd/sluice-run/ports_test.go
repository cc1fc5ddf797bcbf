package main

import (
	"net"
	"regexp"
	"strings"
	"testing"
)

func testSettings() settings {
	return settings{cpPort: "18380", proxyPort: "18310", proxy2Port: "18311", upPort: "18300", adminPort: "18391", admin2Port: "18392", grpcPort: "18381", rlsPort: "18312", rlsAdminPort: "18393"}
}

// TestPortsUsedTwiceInOneRunAreRefused: two of make run's own ports being the
// same (ADMIN_PORT = PROXY_PORT, say) is refused naming both variables, before
// anything starts, rather than two processes failing to bind.
func TestPortsUsedTwiceInOneRunAreRefused(t *testing.T) {
	s := testSettings()
	s.adminPort = s.proxyPort
	err := checkPorts(s)
	if err == nil || !strings.Contains(err.Error(), "PROXY_PORT") || !strings.Contains(err.Error(), "ADMIN_PORT") {
		t.Fatalf("PROXY_PORT = ADMIN_PORT: %v, want an error naming both", err)
	}
}

// TestATakenPortSuggestsAFreeSetOfEveryPort: a port taken (another make run)
// is refused with a command that sets every one of make run's ports, admin
// ports included, each free and none the same, and its own run directory.
func TestATakenPortSuggestsAFreeSetOfEveryPort(t *testing.T) {
	s := testSettings()
	l, err := net.Listen("tcp", "127.0.0.1:"+s.cpPort)
	if err != nil {
		t.Skipf("port %s is not free here: %v", s.cpPort, err)
	}
	defer l.Close()
	s.proxy = proxyRunner{envoyBin: "/x/envoy", version: "1.40.0"}
	err = checkPorts(s)
	if err == nil {
		t.Fatal("a taken port was accepted")
	}
	msg := err.Error()
	if strings.Contains(msg, "dev proxy") {
		t.Errorf("the message speaks of the dev proxy while the run uses Envoy: %s", msg)
	}
	cmd := regexp.MustCompile("`make run ([^`]*)`").FindStringSubmatch(msg)
	if cmd == nil {
		t.Fatalf("no make run command suggested: %s", msg)
	}
	seen := map[string]bool{}
	for _, v := range []string{"RUN_DIR", "CP_PORT", "PROXY_PORT", "PROXY2_PORT", "UPSTREAM_PORT", "ADMIN_PORT", "ADMIN2_PORT", "GRPC_PORT", "RLS_PORT", "RLS_ADMIN_PORT"} {
		m := regexp.MustCompile(`\b` + v + `=(\S+)`).FindStringSubmatch(cmd[1])
		if m == nil {
			t.Errorf("the suggestion sets no %s: %s", v, cmd[1])
			continue
		}
		if v == "RUN_DIR" {
			continue
		}
		if seen[m[1]] {
			t.Errorf("the suggestion uses port %s twice: %s", m[1], cmd[1])
		}
		seen[m[1]] = true
		if l, err := net.Listen("tcp", "127.0.0.1:"+m[1]); err != nil {
			t.Errorf("the suggested %s=%s is not free: %v", v, m[1], err)
		} else {
			l.Close()
		}
	}
}
