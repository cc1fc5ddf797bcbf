package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// policyName returns the {policy} path value, or writes a 400.
func policyName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("policy")
	if !rules.ValidName(name) {
		writeError(w, http.StatusBadRequest, "invalid_name",
			"invalid policy name "+strconv.Quote(name)+": want 1 to 63 bytes of [a-z0-9_.-] starting with [a-z0-9]", nil)
		return "", false
	}
	return name, true
}

// lookup returns the current record of name from the snapshot, reading
// through to the store for names the snapshot does not know. When the store
// cannot be reached and the snapshot was never loaded it answers 503.
func (s *Server) lookup(ctx context.Context, name string) (store.Record, *apiError) {
	if rec, ok := s.o.Snapshot.Get(name); ok {
		return rec, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	defer cancel()
	rec, err := s.o.Snapshot.Load(ctx, name)
	if err != nil {
		if s.o.Snapshot.Loaded() {
			return store.Record{Name: name}, nil // the last snapshot says: no such policy
		}
		return rec, errf(http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable and no snapshot is loaded yet")
	}
	return rec, nil
}

// parseWait reads ?wait= (a Go duration such as "30s", or whole seconds),
// clamped to MaxWait.
func (s *Server) parseWait(r *http.Request) (time.Duration, *apiError) {
	q := r.URL.Query()
	if !q.Has("wait") {
		return 0, nil
	}
	v := q.Get("wait")
	d, err := time.ParseDuration(v)
	if err != nil {
		n, err2 := strconv.ParseUint(v, 10, 32)
		if err2 != nil {
			return 0, errf(http.StatusBadRequest, "invalid_parameter", "wait: want a duration such as 30s, got "+strconv.Quote(v))
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 {
		return 0, errf(http.StatusBadRequest, "invalid_parameter", "wait: must not be negative")
	}
	return min(d, s.o.MaxWait), nil
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, _ role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	wait, aerr := s.parseWait(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	inm, ok := parseCondition(r.Header, "If-None-Match")
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_header", "If-None-Match: want entity tags such as \"v7\" or *", nil)
		return
	}
	rec, aerr := s.lookup(r.Context(), name)
	if aerr != nil {
		aerr.write(w)
		return
	}
	// settled reports whether rec answers the request without waiting: it
	// exists and differs from what the client has, or it was deleted while
	// the request waited or after the version the client has. (A policy that
	// does not exist is otherwise waited for.)
	existed := rec.Exists()
	settled := func(rec store.Record) bool {
		return rec.Exists() && !inm.matchWeak(rec) ||
			!rec.Exists() && (existed || inm.namesOther(rec))
	}
	if wait > 0 {
		defer s.register(r, name)()
	}
	if wait > 0 && !settled(rec) {
		rec = s.longPoll(r.Context(), name, wait, settled)
		if r.Context().Err() != nil {
			return // the client went away
		}
	}
	switch {
	case !rec.Exists():
		if rec.Version > 0 {
			// Deleted: the tombstone's tag tells a filter which deletion this
			// is, so that it stops enforcing the policy, and only newer
			// versions supersede it.
			w.Header().Set("ETag", etag(rec))
		}
		writeError(w, http.StatusNotFound, "not_found", "no policy "+strconv.Quote(name), nil)
	case inm.matchWeak(rec):
		w.Header().Set("ETag", etag(rec))
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusNotModified)
	default:
		w.Header().Set("ETag", etag(rec))
		writeRaw(w, http.StatusOK, rec.Doc)
	}
}

// longPoll waits until settled(record of name) holds, wait passes, the
// request ends or the server drains, and returns the record then.
func (s *Server) longPoll(ctx context.Context, name string, wait time.Duration, settled func(store.Record) bool) store.Record {
	s.metrics.watchers.Add(1)
	defer s.metrics.watchers.Add(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		rec, _, changed, release := s.o.Snapshot.Watch(name)
		if settled(rec) {
			release()
			return rec
		}
		select {
		case <-changed:
			release()
			// Usually the change settles the poll: answer without
			// registering again (1,000 polls wake at once).
			if rec, _ := s.o.Snapshot.Get(name); settled(rec) {
				return rec
			}
		case <-timer.C:
			release()
			return rec
		case <-ctx.Done():
			release()
			return rec
		case <-s.draining:
			release()
			return rec
		}
	}
}

// policyEntry is one element of GET /v1/policies.
type policyEntry struct {
	Policy  string `json:"policy"`
	Version uint64 `json:"version"`
	Rules   int    `json:"rules"`
}

func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request, _ role) {
	if !s.o.Snapshot.Loaded() {
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable and no snapshot is loaded yet", nil)
		return
	}
	out := struct {
		Policies []policyEntry `json:"policies"`
	}{Policies: []policyEntry{}}
	for _, rec := range s.o.Snapshot.List() {
		n := 0
		if p, err := rules.ParsePolicy(rec.Doc); err == nil {
			n = len(p.Rules)
		}
		out.Policies = append(out.Policies, policyEntry{Policy: rec.Name, Version: rec.Version, Rules: n})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getRule(w http.ResponseWriter, r *http.Request, _ role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	rec, aerr := s.lookup(r.Context(), name)
	if aerr != nil {
		aerr.write(w)
		return
	}
	if !rec.Exists() {
		writeError(w, http.StatusNotFound, "not_found", "no policy "+strconv.Quote(name), nil)
		return
	}
	p, err := rules.ParsePolicy(rec.Doc)
	if err != nil {
		s.log.Error("api: stored policy does not parse", "policy", name, "version", rec.Version, "err", err)
		writeError(w, http.StatusInternalServerError, "internal", "the stored policy does not parse", nil)
		return
	}
	id := r.PathValue("id")
	i := ruleIndex(p, id)
	if i < 0 {
		writeError(w, http.StatusNotFound, "not_found", "policy "+strconv.Quote(name)+" has no rule "+strconv.Quote(id), nil)
		return
	}
	w.Header().Set("ETag", etag(rec))
	writeRaw(w, http.StatusOK, rules.EncodeRule(&p.Rules[i]))
}

func ruleIndex(p *rules.Policy, id string) int {
	for i := range p.Rules {
		if p.Rules[i].ID == id {
			return i
		}
	}
	return -1
}

// actor is who made a change: the role and the X-Sluice-Actor header,
// sanitised (printable ASCII, at most 64 bytes).
func actor(who role, r *http.Request) string {
	a := r.Header.Get("X-Sluice-Actor")
	var b strings.Builder
	for i := 0; i < len(a) && b.Len() < 64; i++ {
		if c := a[i]; c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 {
		return who.String()
	}
	return who.String() + ":" + b.String()
}
