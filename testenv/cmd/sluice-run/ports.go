package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// runPort is one port make run listens on, with the make variable that sets it.
type runPort struct{ name, port, variable string }

// ports lists the ports of s, named for the proxy the run starts.
func (s settings) ports() []runPort {
	proxy := s.proxy.name()
	return []runPort{
		{"control plane", s.cpPort, "CP_PORT"}, {proxy, s.proxyPort, "PROXY_PORT"}, {"demo upstream", s.upPort, "UPSTREAM_PORT"},
		{"second " + proxy, s.proxy2Port, "PROXY2_PORT"}, {proxy + "'s admin", s.adminPort, "ADMIN_PORT"},
		{"second " + proxy + "'s admin", s.admin2Port, "ADMIN2_PORT"},
		{"control plane's gRPC (RateLimitService)", s.grpcPort, "GRPC_PORT"},
		{"ratelimit-filter Envoy", s.rlsPort, "RLS_PORT"}, {"ratelimit-filter Envoy's admin", s.rlsAdminPort, "RLS_ADMIN_PORT"},
	}
}

// checkPorts refuses a run whose ports repeat one another, or one whose port is
// taken, with a command line that sets all of them to ports free now (and its
// own run directory, as a run beside another needs).
func checkPorts(s settings) error {
	ps := s.ports()
	for i, p := range ps {
		for _, q := range ps[:i] {
			if p.port == q.port {
				return fmt.Errorf("%s and %s are both %s: the %s and the %s need ports of their own", q.variable, p.variable, p.port, q.name, p.name)
			}
		}
	}
	for _, p := range ps {
		if err := free(p.port); err != nil {
			return fmt.Errorf("port %s for the %s is taken (%v): another make run? Give this one its own directory and ports, e.g. `make run %s`",
				p.port, p.name, err, freeRunArgs(s.runDir))
		}
	}
	return nil
}

// free reports whether port can be listened on at 127.0.0.1.
func free(port string) error {
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return err
	}
	return l.Close()
}

// freeRunArgs returns make variables for a run beside the one in runDir: a
// directory of its own and a set of ports, every one free now, tried in steps
// of 100 from 18080 (control plane), 18010 and 18011 (proxies), 18000
// (upstream), 19901 and 19902 (admin), 18081 (gRPC), 18012 and 19903 (the
// ratelimit-filter Envoy and its admin).
func freeRunArgs(runDir string) string {
	vars := []string{"CP_PORT", "PROXY_PORT", "PROXY2_PORT", "UPSTREAM_PORT", "ADMIN_PORT", "ADMIN2_PORT", "GRPC_PORT", "RLS_PORT", "RLS_ADMIN_PORT"}
	base := []int{18080, 18010, 18011, 18000, 19901, 19902, 18081, 18012, 19903}
	dir := strings.TrimSuffix(runDir, "/") + "2"
	for step := 0; step < 20; step++ {
		args := []string{"RUN_DIR=" + dir}
		ok := true
		for i, v := range vars {
			p := strconv.Itoa(base[i] + 100*step)
			if free(p) != nil {
				ok = false
				break
			}
			args = append(args, v+"="+p)
		}
		if ok {
			return strings.Join(args, " ")
		}
	}
	return "RUN_DIR=" + dir + " CP_PORT=… PROXY_PORT=… PROXY2_PORT=… UPSTREAM_PORT=… ADMIN_PORT=… ADMIN2_PORT=… GRPC_PORT=… RLS_PORT=… RLS_ADMIN_PORT=… (no free set found from 18000)"
}
