package devproxy

import (
	"net"
	"net/netip"
	"strings"
)

// trustedClient applies the HTTP connection manager's rules for the trusted
// client address and x-forwarded-for, as Envoy runs them before any HTTP
// filter (source/common/http/conn_manager_utility.cc, mutateRequestHeaders;
// with use_remote_address false, the default XFF original-IP-detection
// extension the HCM installs, source/extensions/http/original_ip_detection/xff/xff.cc;
// docs: configuration/http/http_conn_man/headers.rst, "x-forwarded-for"):
//
//   - use_remote_address true: with xff_num_trusted_hops N > 0, the N-th
//     address from the right of x-forwarded-for as it arrived; otherwise,
//     or if that entry is missing or not an IP address, the TCP peer. Then,
//     unless skip_xff_append, the peer is appended to x-forwarded-for (the
//     Envoy's own local address instead when the peer is loopback).
//   - use_remote_address false: the (N+1)-th address from the right of
//     x-forwarded-for (N = xff_num_trusted_hops, so the rightmost with 0),
//     falling back to the peer; x-forwarded-for is left alone.
//
// peer is the TCP peer; xff is the request's x-forwarded-for, its values
// joined with "," as Envoy's header map joins an inline header, and hasXFF
// whether there was one; local is the Envoy's local address
// (envoyLocalAddress). It returns the downstream remote address Envoy sets
// for the stream (source.address, %DOWNSTREAM_REMOTE_ADDRESS%), port 0 when
// it came from x-forwarded-for (Network::Utility::parseInternetAddressNoThrow),
// and the x-forwarded-for to forward (outHas false: none).
func (c *EnvoyConfig) trustedClient(peer netip.AddrPort, xff string, hasXFF bool, local netip.Addr) (remote netip.AddrPort, outXFF string, outHas bool) {
	remote, outXFF, outHas = peer, xff, hasXFF
	hops := int(c.XffNumTrustedHops)
	if !c.UseRemoteAddress {
		if hasXFF {
			if a, ok := lastAddressFromXFF(xff, hops); ok {
				remote = netip.AddrPortFrom(a, 0)
			}
		}
		return remote, outXFF, outHas
	}
	if hops > 0 && hasXFF {
		if a, ok := lastAddressFromXFF(xff, hops-1); ok {
			remote = netip.AddrPortFrom(a, 0)
		}
	}
	if !c.SkipXffAppend {
		app := peer.Addr()
		if isLoopback(app) {
			app = local
		}
		if outHas {
			outXFF += "," // HeaderMapImpl::appendToHeader with delimiter ","
		}
		outXFF += app.String()
		outHas = true
	}
	return remote, outXFF, outHas
}

// lastAddressFromXFF is Envoy's Http::Utility::getLastAddressFromXFF
// (source/common/http/utility.cc): skip skip entries from the right, take
// the text after the last remaining comma (the whole rest if there is
// none), trim whitespace, and parse it as a bare IPv4 or IPv6 address: a
// port or brackets make it no address.
func lastAddressFromXFF(xff string, skip int) (netip.Addr, bool) {
	s := xff
	for i := 0; i < skip; i++ {
		j := strings.LastIndexByte(s, ',')
		if j < 0 {
			return netip.Addr{}, false
		}
		s = s[:j]
	}
	if j := strings.LastIndexByte(s, ','); j >= 0 && j+1 < len(s) {
		s = s[j+1:]
	}
	s = strings.Trim(s, " \t\f\v\n\r")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a, true
}

// isLoopback is Network::Utility::isLoopbackAddress: exactly 127.0.0.1 or
// ::1, not the rest of 127.0.0.0/8.
func isLoopback(a netip.Addr) bool {
	return a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || a == netip.IPv6Loopback()
}

// envoyLocalAddress is the address Envoy appends to x-forwarded-for for a
// loopback peer: the server's local address (LocalInfo), which
// Network::Utility::getLocalAddress picks as the first non-loopback IPv4
// interface address, or 127.0.0.1 if there is none (Envoy's default
// --local-address-ip-version v4).
func envoyLocalAddress() netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() && !isLoopback(ip) {
				return ip
			}
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}
