package api

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// ErrBootstrapInvalid is matched (errors.Is) by Bootstrap's error for a document
// that is not a valid policy; the error lists each problem with its field.
var ErrBootstrapInvalid = errors.New("api: bootstrap policy invalid")

// CheckBootstrap validates a policy document (JSON) as PUT /v1/policies/{name}
// would, name taken from its "policy" field; it returns the name. The error
// wraps ErrBootstrapInvalid and names every bad field.
func CheckBootstrap(doc []byte) (string, error) {
	p, err := parseBootstrap(doc)
	if err != nil {
		return "", err
	}
	return p.Name, nil
}

// parseBootstrap is CheckBootstrap returning the parsed policy.
func parseBootstrap(doc []byte) (*rules.Policy, error) {
	d := rules.DecodePolicy(doc)
	if d.Missing("policy") {
		return nil, fmt.Errorf("%w: \"policy\" (the policy's name) is required", ErrBootstrapInvalid)
	}
	p, aerr := parsePolicyBody(doc, d.Policy.Name)
	if aerr != nil {
		var b strings.Builder
		b.WriteString(aerr.message)
		for _, det := range aerr.details {
			b.WriteString("; " + det.Field + ": " + det.Message)
		}
		return nil, fmt.Errorf("%w: %s", ErrBootstrapInvalid, b.String())
	}
	return p, nil
}

// Bootstrap creates the policy doc (JSON, checked by CheckBootstrap) as version 1
// if the store never held a policy of its name, and reports whether it did. A
// policy that exists, or was deleted (its tombstone stays), is never touched: the
// bootstrap seeds an empty store and cannot undo a user's change. Two replicas
// bootstrapping at once create it once (the second commit conflicts). An error is
// the store's (retry later) or ErrBootstrapInvalid.
func (s *Server) Bootstrap(ctx context.Context, doc []byte) (created bool, err error) {
	p, err := parseBootstrap(doc)
	if err != nil {
		return false, err
	}
	name := p.Name
	gctx, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	rec, err := s.o.Store.Get(gctx, name)
	cancel()
	if err != nil {
		return false, err
	}
	if rec.Version != 0 {
		return false, nil
	}
	p.Version = 1
	ch := store.Change{Name: name, Base: 0, Doc: rules.EncodePolicy(p), Op: store.OpPutPolicy,
		Actor: "bootstrap", Detail: "--bootstrap-policy", Time: s.o.Now().UTC(), ID: newWriteID()}
	cctx, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	ticket := s.o.Snapshot.Ticket()
	nrec, err := s.o.Store.Commit(cctx, ch)
	cancel()
	if errors.Is(err, store.ErrConflict) {
		return false, nil // another replica (or a user) wrote it first
	}
	if err != nil {
		return false, err
	}
	s.o.Snapshot.ApplyRead(nrec, ticket)
	s.log.Info("api: bootstrap policy created", "policy", name, "version", nrec.Version)
	return true, nil
}
