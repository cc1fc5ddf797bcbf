// Package bootstrap rewrites an Envoy bootstrap shipped in envoy/ for the
// addresses and files of one run: listeners, admin endpoint, cluster endpoints,
// the file access log's path and file names (the Wasm module, TLS files). It is
// the one place where tests and make run change a shipped bootstrap, and
// nothing else in it changes.
package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Rewrite is everything a test may change in a bootstrap shipped in envoy/:
// addresses, ports and file paths. The rest (filters, their configuration,
// access-log format, clusters' other settings) runs as shipped.
type Rewrite struct {
	// Listeners are the listeners' socket addresses ("127.0.0.1:port"), in the
	// bootstrap's order; there must be exactly one per listener.
	Listeners []string
	// Admin is the admin endpoint's address, required; a bootstrap without an
	// admin endpoint gets one.
	Admin string
	// Clusters maps a cluster name to the address every endpoint of that
	// cluster gets; each name must be a cluster of the bootstrap.
	Clusters map[string]string
	// AccessLog, when set, is the path of every file access log
	// (envoy.access_loggers.file).
	AccessLog string
	// Files maps a "filename" value of the bootstrap (the Wasm module, TLS
	// certificates and keys) to the path that replaces it; each must occur.
	Files map[string]string
}

const fileAccessLogType = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"

// Apply returns the bootstrap src (YAML) with r applied, as YAML.
// It fails when src is not YAML, an address is not host:port (Admin missing
// included), or r names a cluster or file the bootstrap does not have, or gives a
// different number of listeners, so that a rename in envoy/ breaks the test or
// make run instead of being silently run with the shipped address.
func Apply(src []byte, r Rewrite) ([]byte, error) {
	var root map[string]any
	if err := yaml.Unmarshal(src, &root); err != nil {
		return nil, err
	}
	if _, ok := root["admin"]; !ok && r.Admin != "" {
		root["admin"] = map[string]any{"address": map[string]any{"socket_address": map[string]any{}}}
	}
	if err := setSocketAddress(dig(root, "admin", "address"), r.Admin); err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	static, _ := root["static_resources"].(map[string]any)
	listeners, _ := static["listeners"].([]any)
	if len(listeners) != len(r.Listeners) {
		return nil, fmt.Errorf("%d listener addresses for %d listeners", len(r.Listeners), len(listeners))
	}
	for i, l := range listeners {
		if err := setSocketAddress(dig(l, "address"), r.Listeners[i]); err != nil {
			return nil, fmt.Errorf("listener %d: %w", i, err)
		}
	}
	if err := rewriteClusters(static, r.Clusters); err != nil {
		return nil, err
	}
	found := map[string]bool{}
	walk(root, func(m map[string]any) {
		if f, ok := m["filename"].(string); ok {
			if to, ok := r.Files[f]; ok {
				m["filename"], found[f] = to, true
			}
		}
		if m["@type"] == fileAccessLogType && r.AccessLog != "" {
			m["path"] = r.AccessLog
		}
	})
	for f := range r.Files {
		if !found[f] {
			return nil, fmt.Errorf("no filename %q in the bootstrap", f)
		}
	}
	return yaml.Marshal(root)
}

func rewriteClusters(static map[string]any, addrs map[string]string) error {
	clusters, _ := static["clusters"].([]any)
	done := map[string]bool{}
	for _, c := range clusters {
		name, _ := dig(c, "name").(string)
		addr, ok := addrs[name]
		if !ok {
			continue
		}
		endpoints, _ := dig(c, "load_assignment", "endpoints").([]any)
		for _, ep := range endpoints {
			lbs, _ := dig(ep, "lb_endpoints").([]any)
			for _, lb := range lbs {
				if err := setSocketAddress(dig(lb, "endpoint", "address"), addr); err != nil {
					return fmt.Errorf("cluster %s: %w", name, err)
				}
				done[name] = true
			}
		}
	}
	for name := range addrs {
		if !done[name] {
			return fmt.Errorf("no cluster %q with endpoints in the bootstrap", name)
		}
	}
	return nil
}

// setSocketAddress sets address.socket_address to hostport.
func setSocketAddress(address any, hostport string) error {
	sa, ok := dig(address, "socket_address").(map[string]any)
	if !ok {
		return errors.New("no socket_address")
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	sa["address"], sa["port_value"] = host, p
	return nil
}

// dig follows map keys from v; nil when one is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// walk calls f on every map in v, depth first.
func walk(v any, f func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(x)
		for _, c := range x {
			walk(c, f)
		}
	case []any:
		for _, c := range x {
			walk(c, f)
		}
	}
}
