package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
	"github.com/sluice-proxy/sluice/shared/strictjson"
)

// versionEntry is one element of GET /v1/policies/{policy}/versions.
type versionEntry struct {
	Version uint64    `json:"version"`
	Time    time.Time `json:"time"`
	Actor   string    `json:"actor"`
	Op      string    `json:"op"`
	Detail  string    `json:"detail,omitempty"`
	Deleted bool      `json:"deleted,omitempty"`
}

// versionsBody is the body of GET /v1/policies/{policy}/versions.
type versionsBody struct {
	Policy   string         `json:"policy"`
	Current  uint64         `json:"current"`
	Exists   bool           `json:"exists"`
	Depth    int            `json:"depth"`
	Versions []versionEntry `json:"versions"`
}

// history reads name's current record and retained history from the store
// (not the snapshot: history is not kept in memory). False when it answered:
// 503 store_unavailable, or 404 for a policy never written.
func (s *Server) history(w http.ResponseWriter, r *http.Request, name string) (store.Record, []store.HistoryEntry, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), s.o.StoreTimeout)
	defer cancel()
	rec, err := s.o.Store.Get(ctx, name)
	var h []store.HistoryEntry
	if err == nil && rec.Version > 0 {
		h, err = s.o.Store.History(ctx, name)
	}
	if err != nil {
		s.o.Snapshot.ReportError(err)
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable; history is not kept in memory, retry later", nil)
		return rec, nil, false
	}
	if rec.Version == 0 {
		notFoundPolicy(name).write(w)
		return rec, nil, false
	}
	return rec, h, true
}

func (s *Server) listVersions(w http.ResponseWriter, r *http.Request, _ role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	rec, h, ok := s.history(w, r, name)
	if !ok {
		return
	}
	out := versionsBody{Policy: name, Current: rec.Version, Exists: rec.Exists(), Depth: s.o.HistoryDepth, Versions: []versionEntry{}}
	for _, e := range h {
		out.Versions = append(out.Versions, versionEntry{Version: e.Version, Time: e.Time.UTC(), Actor: e.Actor, Op: string(e.Op), Detail: e.Detail, Deleted: e.Doc == nil})
	}
	if rec.Exists() {
		w.Header().Set("ETag", etag(rec))
	}
	writeJSON(w, http.StatusOK, out)
}

// getVersion answers GET /v1/policies/{policy}/versions/{version}: the
// document that version stored, from the history (404 version_not_found for a
// version the policy never had, version_expired for one no longer kept, and
// not_found for a version that deleted the policy).
func (s *Server) getVersion(w http.ResponseWriter, r *http.Request, _ role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	v, err := strconv.ParseUint(r.PathValue("version"), 10, 64)
	if err != nil || v == 0 {
		writeError(w, http.StatusBadRequest, "invalid_version", "version "+strconv.Quote(r.PathValue("version"))+": want a whole number ≥ 1", nil)
		return
	}
	rec, h, ok := s.history(w, r, name)
	if !ok {
		return
	}
	for _, e := range h {
		switch {
		case e.Version != v:
		case e.Doc == nil:
			writeError(w, http.StatusNotFound, "not_found", "version "+strconv.FormatUint(v, 10)+" of policy "+strconv.Quote(name)+" deleted it", nil)
			return
		default:
			writeRaw(w, http.StatusOK, e.Doc)
			return
		}
	}
	if v > rec.Version {
		errf(http.StatusNotFound, "version_not_found", "policy "+strconv.Quote(name)+" has no version "+strconv.FormatUint(v, 10)+" (current "+strconv.FormatUint(rec.Version, 10)+")").write(w)
		return
	}
	errf(http.StatusNotFound, "version_expired", "version "+strconv.FormatUint(v, 10)+" of policy "+strconv.Quote(name)+" is no longer in the history (the last "+strconv.Itoa(s.o.HistoryDepth)+" versions are kept)").write(w)
}

// parseRollback decodes the body of POST /v1/policies/{policy}/rollback,
// {"version": N} with N ≥ 1, as strictly as a policy (shared/strictjson:
// RFC 8259, no duplicate keys, no unknown fields, no trailing data). On a
// problem it returns a 400 listing each with its field.
func parseRollback(body []byte) (uint64, *apiError) {
	d := strictjson.NewDecoder(body, strictjson.Limits{MaxBytes: 1024, MaxDepth: 2})
	var version uint64
	seen := false
	_ = d.Object(func(key string) error {
		if key != "version" {
			return d.UnknownField()
		}
		seen = true
		v, err := d.Uint64()
		if err == nil && v == 0 {
			d.Fail("must be at least 1")
		}
		version = v
		return nil
	})
	_ = d.End()
	var details []Detail
	for _, e := range d.Errors() {
		details = append(details, Detail{Field: e.Path, Message: e.Message})
	}
	if len(details) == 0 && !seen {
		details = append(details, Detail{Field: "version", Message: `required: {"version": N} with N ≥ 1`})
	}
	if len(details) > 0 {
		e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid: "+strconv.Itoa(len(details))+" problem(s)")
		e.details = details
		return 0, e
	}
	return version, nil
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	target, aerr := parseRollback(body)
	if aerr != nil {
		aerr.write(w)
		return
	}
	s.write(w, r, who, name, writeOpts{op: store.OpRollback, created: http.StatusOK, ok: http.StatusOK},
		func(_ *rules.Policy, rec store.Record) (*rules.Policy, string, *apiError) {
			if rec.Version == 0 {
				return nil, "", notFoundPolicy(name)
			}
			ctx, cancel := context.WithTimeout(r.Context(), s.o.StoreTimeout)
			defer cancel()
			h, err := s.o.Store.History(ctx, name)
			if err != nil {
				s.o.Snapshot.ReportError(err)
				return nil, "", errf(http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable; the write was not applied, retry later")
			}
			var found *store.HistoryEntry
			for i := range h {
				if h[i].Version == target {
					found = &h[i]
				}
			}
			switch {
			case found == nil && target > rec.Version:
				return nil, "", errf(http.StatusNotFound, "version_not_found", "policy "+strconv.Quote(name)+" has no version "+strconv.FormatUint(target, 10)+" (current "+strconv.FormatUint(rec.Version, 10)+")")
			case found == nil && !rec.Exists():
				return nil, "", errf(http.StatusNotFound, "version_expired", "policy "+strconv.Quote(name)+" was deleted, and deleting a policy drops its earlier versions; PUT the document again to re-create it")
			case found == nil:
				return nil, "", errf(http.StatusNotFound, "version_expired", "version "+strconv.FormatUint(target, 10)+" of policy "+strconv.Quote(name)+" is no longer in the history (the last "+strconv.Itoa(s.o.HistoryDepth)+" versions are kept)")
			case found.Doc == nil:
				return nil, "", errf(http.StatusBadRequest, "invalid_version", "version "+strconv.FormatUint(target, 10)+" is a deletion; nothing to roll back to")
			}
			p, err := rules.ParsePolicy(found.Doc)
			if err != nil {
				return nil, "", errf(http.StatusBadRequest, "invalid_version", "version "+strconv.FormatUint(target, 10)+" no longer validates: "+err.Error())
			}
			return p, "to v" + strconv.FormatUint(target, 10), nil
		})
}
