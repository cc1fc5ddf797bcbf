// Package grpcauth authenticates the callers of the control plane's gRPC
// services (the Rate Limit Quota Service's streams, the RateLimitService's
// calls) as POST /v1/quota authenticates an Envoy: a verified client
// certificate (identity mode certificate), else the quota token in
// "authorization: Bearer …" metadata (Envoy's grpc_service initial_metadata),
// with the mesh sidecar's x-forwarded-client-cert naming the identity in XFCC
// mode. docs/rlqs.md, "The gRPC listener", has the rules.
package grpcauth

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/controlplane/internal/quota"
)

// Owner returns the ledger owner of the caller of ctx ("" for a token caller
// outside XFCC mode, as quota.Owner has it), or a gRPC status error:
// UNAUTHENTICATED without the credential the mode needs, PERMISSION_DENIED with
// a wrong one. what names the calls in messages, e.g. "RLQS streams".
func Owner(ctx context.Context, q *quota.Service, what string) (string, error) {
	// Metadata is read by key (metadata.ValueFromIncomingContext), not copied
	// whole: a RateLimitService call authenticates every time.
	switch q.Identity() {
	case quota.IdentityCertificate:
		p, ok := peer.FromContext(ctx)
		var info credentials.TLSInfo
		if ok {
			info, ok = p.AuthInfo.(credentials.TLSInfo)
		}
		if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
			return "", status.Error(codes.Unauthenticated, what+" need a client certificate signed by the control plane's client CA (--client-ca-file)")
		}
		id := quota.CertificateIdentity(info.State.VerifiedChains[0][0])
		if id == "" {
			return "", status.Error(codes.PermissionDenied, "the client certificate has neither a URI nor a DNS subject alternative name to identify the Envoy by")
		}
		return quota.Owner(id), nil
	}
	required, refuseAll := q.TokenRequired()
	if refuseAll {
		return "", status.Error(codes.PermissionDenied, "quota calls are disabled: no quota token is configured (--quota-token)")
	}
	if required {
		auth := first(metadata.ValueFromIncomingContext(ctx, "authorization"))
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || token == "" {
			return "", status.Error(codes.Unauthenticated, what+` need the quota token in "authorization: Bearer <token>" metadata`)
		}
		if !q.TokenOK(token) {
			return "", status.Error(codes.PermissionDenied, "the bearer token is not the quota token")
		}
	}
	if q.Identity() == quota.IdentityXFCC {
		if p, ok := peer.FromContext(ctx); !ok || !quota.SidecarPeer(p.Addr.String()) {
			return "", status.Error(codes.Unauthenticated, "x-forwarded-client-cert is trusted only from this pod's own sidecar (a loopback peer such as Istio's 127.0.0.6): is the control plane's sidecar injected (on a revision-based Istio, the namespace needs istio.io/rev)?")
		}
		id, err := quota.XFCCIdentity(metadata.ValueFromIncomingContext(ctx, "x-forwarded-client-cert"))
		if err != nil {
			return "", status.Error(codes.Unauthenticated, what+" need the x-forwarded-client-cert metadata of the mesh sidecar, with a URI or DNS in its last element (--trust-xfcc): "+err.Error())
		}
		return quota.Owner(id), nil
	}
	return "", nil
}

func first(v []string) string {
	if len(v) > 0 {
		return v[0]
	}
	return ""
}
