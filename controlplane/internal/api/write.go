package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/sluice-proxy/sluice/controlplane/internal/httpjson"
	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// maxAttempts bounds how often a write without If-Match is recomputed after
// losing a race to another writer.
const maxAttempts = 8

// mutation computes the next policy from the current one (nil when the
// policy does not exist). It returns the new policy, or nil to delete it.
type mutation func(cur *rules.Policy, rec store.Record) (next *rules.Policy, detail string, aerr *apiError)

// writeOpts say how to answer a successful write.
type writeOpts struct {
	op store.Operation
	// created is the status when the policy did not exist before (201 for
	// PUT and POST), ok otherwise.
	created, ok int
	// location, if set, is sent as the Location header.
	location string
	// createOnly honours If-None-Match: * (PUT of a whole policy).
	createOnly bool
	// dryRun runs every check (validation, preconditions, the policy
	// count) and answers what would be stored, without writing.
	dryRun bool
}

// readBody reads a JSON request body: 415 for a Content-Type other than
// application/json (httpjson.CheckJSON), 413 beyond MaxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if msg, ok := httpjson.CheckJSON(r); !ok {
		return nil, errf(http.StatusUnsupportedMediaType, "unsupported_media_type", msg)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errf(http.StatusRequestEntityTooLarge, "too_large", "request body exceeds "+strconv.FormatInt(mbe.Limit, 10)+" bytes")
		}
		return nil, errf(http.StatusBadRequest, "bad_request", "reading the request body failed")
	}
	return body, nil
}

// invalid turns a rules validation error into a 400 with every problem.
func invalid(err error) *apiError { return invalidBody(err, nil) }

// invalidBody is invalid for a document read from body: a problem found while
// reading the JSON is located (byte offset, line and column) in it.
func invalidBody(err error, body []byte) *apiError {
	e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid")
	var errs rules.Errors
	if errors.As(err, &errs) {
		e.message = "the document is invalid: " + strconv.Itoa(len(errs)) + " problem(s)"
		for _, fe := range errs {
			d := Detail{Field: fe.Field, Message: fe.Message}
			if fe.Decoding && body != nil {
				d = d.Locate(body, fe.Offset)
			}
			e.details = append(e.details, d)
		}
	}
	return e
}

func newWriteID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// write runs a read-modify-write of policy name: it reads the current record
// from the store, checks If-Match (and If-None-Match: * for createOnly),
// applies m, and commits with the version it read. Losing a race is 412 when
// the client sent If-Match, and retried otherwise.
func (s *Server) write(w http.ResponseWriter, r *http.Request, who role, name string, o writeOpts, m mutation) {
	ifMatch, ok1 := parseCondition(r.Header, "If-Match")
	inm, ok2 := parseCondition(r.Header, "If-None-Match")
	if !ok1 || !ok2 {
		writeError(w, http.StatusBadRequest, "invalid_header", "If-Match/If-None-Match: want entity tags such as \"v7\" or *", nil)
		return
	}
	if inm.present && (!o.createOnly || !inm.any || len(inm.tags) > 0) {
		writeError(w, http.StatusBadRequest, "invalid_header", "If-None-Match on a write: only * is supported, and only on PUT of a whole policy", nil)
		return
	}
	wr := &writeReq{w: w, r: r, who: who, name: name, o: o, m: m, ifMatch: ifMatch, inm: inm, id: newWriteID()}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		rec, cur, ok := s.readForWrite(wr)
		if !ok {
			return
		}
		ch, ok := s.change(wr, rec, cur)
		if !ok {
			return
		}
		if o.dryRun {
			s.warn(w, wr.warnings)
			s.answerDryRun(w, rec, ch.Doc, o)
			return
		}
		if !s.commitWrite(wr, rec, ch) {
			continue // lost a race without a condition: read again
		}
		return
	}
	writeError(w, http.StatusConflict, "conflict", "too many concurrent writers to policy "+strconv.Quote(name)+"; retry", nil)
}

// writeReq is one write request being served (write).
type writeReq struct {
	w            http.ResponseWriter
	r            *http.Request
	who          role
	name         string
	o            writeOpts
	m            mutation
	ifMatch, inm condition
	id           string // the change's id, the same on every attempt
	// warnings are Options.Warnings about the policy to write, answered
	// (warn) only with an answer that writes it or would (a dry run).
	warnings []string
}

// readForWrite reads the current record of the policy and parses it, and
// checks the request's conditions against it. False when it answered (a
// precondition failed, the store is unavailable, the stored policy is broken).
func (s *Server) readForWrite(wr *writeReq) (store.Record, *rules.Policy, bool) {
	ctx, cancel := context.WithTimeout(wr.r.Context(), s.o.StoreTimeout)
	rec, err := s.o.Store.Get(ctx, wr.name)
	cancel()
	if err != nil {
		s.unavailable(wr.w, err)
		return rec, nil, false
	}
	if wr.ifMatch.present && !wr.ifMatch.matchStrong(rec) || wr.inm.any && rec.Exists() {
		s.preconditionFailed(wr.w, rec)
		return rec, nil, false
	}
	var cur *rules.Policy
	if rec.Exists() {
		if cur, err = rules.ParsePolicy(rec.Doc); err != nil {
			s.log.Error("api: stored policy does not parse", "policy", wr.name, "version", rec.Version, "err", err)
			writeError(wr.w, http.StatusInternalServerError, "internal", "the stored policy does not parse", nil)
			return rec, nil, false
		}
	}
	return rec, cur, true
}

// change applies the mutation to cur and checks the result: valid (with the
// warnings it draws), within the policy cap and the document size. False when
// it answered: an error, or the declarative apply of what is already stored
// (no new version).
func (s *Server) change(wr *writeReq, rec store.Record, cur *rules.Policy) (store.Change, bool) {
	w, o := wr.w, wr.o
	next, detail, aerr := wr.m(cur, rec)
	if aerr != nil {
		aerr.write(w)
		return store.Change{}, false
	}
	ch := store.Change{Name: wr.name, Base: rec.Version, Op: o.op, Actor: actor(wr.who, wr.r), Detail: detail, Time: s.o.Now().UTC(), ID: wr.id}
	if next == nil {
		return ch, true
	}
	next.Name, next.Version = wr.name, rec.Version
	if err := next.Validate(); err != nil {
		invalid(err).write(w)
		return ch, false
	}
	if aerr := s.checkDescriptorsFree(wr.name, next); aerr != nil {
		aerr.write(w)
		return ch, false
	}
	wr.warnings = nil
	if s.o.Warnings != nil {
		wr.warnings = s.o.Warnings(next)
	}
	if o.op == store.OpPutPolicy && rec.Exists() && bytes.Equal(rules.EncodePolicy(next), rec.Doc) {
		s.warn(w, wr.warnings)
		// Declarative apply of what is already there: no new version.
		if o.dryRun {
			w.Header().Set("X-Sluice-Dry-Run", "true")
		}
		w.Header().Set("ETag", etag(rec))
		writeRaw(w, o.ok, rec.Doc)
		return ch, false
	}
	if !rec.Exists() {
		if aerr := s.checkPolicyCount(wr.r); aerr != nil {
			aerr.write(w)
			return ch, false
		}
	}
	next.Version = rec.Version + 1
	ch.Doc = rules.EncodePolicy(next)
	if len(ch.Doc) > rules.MaxPolicyBytes {
		// Rules added one by one can outgrow what ParsePolicy (the
		// filter's and every later write's) accepts.
		e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid: 1 problem(s)")
		e.details = []Detail{{Field: "", Message: "the resulting policy would be " + strconv.Itoa(len(ch.Doc)) +
			" bytes, more than the maximum of " + strconv.Itoa(rules.MaxPolicyBytes)}}
		e.write(w)
		return ch, false
	}
	return ch, true
}

// commitWrite commits ch on the record read (rec) and answers it. False, with
// nothing answered, when another write won the race and the request had no
// condition: the caller reads again.
func (s *Server) commitWrite(wr *writeReq, rec store.Record, ch store.Change) bool {
	w, r, o := wr.w, wr.r, wr.o
	ctx, cancel := context.WithTimeout(r.Context(), s.o.StoreTimeout)
	ticket := s.o.Snapshot.Ticket()
	nrec, err := s.o.Store.Commit(ctx, ch)
	cancel()
	if errors.Is(err, store.ErrConflict) {
		if !wr.ifMatch.present && !wr.inm.any {
			return false
		}
		gctx, gcancel := context.WithTimeout(r.Context(), s.o.StoreTimeout)
		cur, _ := s.o.Store.Get(gctx, wr.name)
		gcancel()
		s.preconditionFailed(w, cur)
		return true
	}
	if err != nil {
		s.unavailable(w, err)
		return true
	}
	s.o.Snapshot.ApplyRead(nrec, ticket)
	s.log.Info("api: policy changed", "policy", wr.name, "version", nrec.Version, "op", o.op, "actor", ch.Actor, "detail", ch.Detail)
	s.warn(w, wr.warnings)
	w.Header().Set("ETag", etag(nrec))
	if o.location != "" {
		w.Header().Set("Location", o.location)
	}
	status := o.ok
	if !rec.Exists() {
		status = o.created
	}
	if nrec.Doc == nil {
		writeJSON(w, status, deleted{Policy: wr.name, Version: nrec.Version, Deleted: true})
		return true
	}
	writeRaw(w, status, nrec.Doc)
	return true
}

// checkDescriptorsFree refuses (409 descriptor_conflict) a policy with a
// descriptor rule whose descriptor another current policy's rule already
// names: the RateLimitService serves one rule per descriptor, so the second
// would never be served. The other policies are the snapshot's, as the
// RateLimitService reads them.
func (s *Server) checkDescriptorsFree(name string, next *rules.Policy) *apiError {
	mine := map[string]string{}
	for i := range next.Rules {
		if d := next.Rules[i].Descriptor; d != nil {
			mine[d.Path()] = next.Rules[i].ID
		}
	}
	if len(mine) == 0 {
		return nil
	}
	for _, rec := range s.o.Snapshot.List() {
		if rec.Name == name || !rec.Exists() || !bytes.Contains(rec.Doc, []byte(`"descriptor"`)) {
			continue
		}
		other, err := rules.ParsePolicy(rec.Doc)
		if err != nil {
			continue
		}
		for i := range other.Rules {
			d := other.Rules[i].Descriptor
			if d == nil {
				continue
			}
			if id, ok := mine[d.Path()]; ok {
				return errf(http.StatusConflict, "descriptor_conflict", "rule "+strconv.Quote(id)+"'s descriptor (domain "+
					strconv.Quote(d.Domain)+") is already rule "+strconv.Quote(other.Rules[i].ID)+"'s of policy "+strconv.Quote(rec.Name)+
					": the RateLimitService serves one rule per descriptor; change or remove one of them")
			}
		}
	}
	return nil
}

// checkPolicyCount refuses the creation of a policy when MaxPolicies live
// policies exist (409 too_many_policies), or 503 if the store cannot say.
// The count is read from the store, so concurrent creations through several
// replicas may overshoot the cap by the number of racing writers.
func (s *Server) checkPolicyCount(r *http.Request) *apiError {
	ctx, cancel := context.WithTimeout(r.Context(), s.o.StoreTimeout)
	list, err := s.o.Store.List(ctx)
	cancel()
	if err != nil {
		s.o.Snapshot.ReportError(err)
		return errf(http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable; the write was not applied, retry later")
	}
	if len(list) >= s.o.MaxPolicies {
		return errf(http.StatusConflict, "too_many_policies",
			"there are already "+strconv.Itoa(len(list))+" policies, the maximum (--max-policies "+strconv.Itoa(s.o.MaxPolicies)+"); delete one first or raise the limit")
	}
	return nil
}

// deleted is the body of DELETE /v1/policies/{policy}.
type deleted struct {
	Policy  string `json:"policy"`
	Version uint64 `json:"version"`
	Deleted bool   `json:"deleted"`
}

func (s *Server) unavailable(w http.ResponseWriter, err error) {
	s.o.Snapshot.ReportError(err)
	s.log.Warn("api: store unavailable for a write", "err", err)
	writeError(w, http.StatusServiceUnavailable, "store_unavailable",
		"the store is unreachable or did not confirm the write, so it is not acknowledged; retry later (with If-Match a retry cannot apply it twice). Reads are served from the last snapshot", nil)
}

func (s *Server) preconditionFailed(w http.ResponseWriter, rec store.Record) {
	msg := "the policy does not exist"
	if rec.Exists() {
		w.Header().Set("ETag", etag(rec))
		msg = "the policy is at version " + strconv.FormatUint(rec.Version, 10) + " (ETag " + etag(rec) + ")"
	}
	writeError(w, http.StatusPreconditionFailed, "precondition_failed", "precondition failed: "+msg, nil)
}

// parsePolicyBody parses a PUT body for policy name: its "policy" member
// must be absent or equal name (absent takes name); its "rules" member is
// required ("rules": [] for none); its "version" member is ignored (the server
// assigns versions; use If-Match for optimistic concurrency). The body is read
// once and validated once, with every problem in one 400.
func parsePolicyBody(body []byte, name string) (*rules.Policy, *apiError) {
	doc := rules.DecodePolicy(body)
	if doc.Missing("policy") {
		doc.Policy.Name = name
	}
	p, err := doc.Validate()
	if err != nil {
		e := invalidBody(err, body)
		if doc.Missing("rules") {
			e.details = append(e.details, rulesRequired)
			e.message = "the document is invalid: " + strconv.Itoa(len(e.details)) + " problem(s)"
		}
		return nil, e
	}
	if doc.Missing("rules") {
		e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid: 1 problem(s)")
		e.details = []Detail{rulesRequired}
		return nil, e
	}
	if p.Name != name {
		e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid: 1 problem(s)")
		e.details = []Detail{{Field: "policy", Message: "must be " + strconv.Quote(name) + " (the name in the path) or absent"}}
		return nil, e
	}
	return p, nil
}

// rulesRequired is the problem of a PUT body without "rules": a replacement
// must say which rules the policy has, so that a partial document (or an
// empty one) never silently removes them all.
var rulesRequired = Detail{Field: "rules", Message: `required: a policy replaces the whole policy; send "rules": [] for a policy without rules`}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	dryRun, aerr := parseDryRun(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	p, aerr := parsePolicyBody(body, name)
	if aerr != nil {
		aerr.write(w)
		return
	}
	s.write(w, r, who, name, writeOpts{op: store.OpPutPolicy, created: http.StatusCreated, ok: http.StatusOK, createOnly: true, dryRun: dryRun},
		func(*rules.Policy, store.Record) (*rules.Policy, string, *apiError) {
			next := *p
			return &next, "", nil
		})
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	s.write(w, r, who, name, writeOpts{op: store.OpDeletePolicy, ok: http.StatusOK},
		func(cur *rules.Policy, _ store.Record) (*rules.Policy, string, *apiError) {
			if cur == nil {
				return nil, "", errf(http.StatusNotFound, "not_found", "no policy "+strconv.Quote(name))
			}
			return nil, "", nil
		})
}

func notFoundPolicy(name string) *apiError {
	return errf(http.StatusNotFound, "not_found", "no policy "+strconv.Quote(name))
}

func (s *Server) addRule(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	rule, err := rules.ParseRule(body, "")
	if err != nil {
		invalidBody(err, body).write(w)
		return
	}
	s.write(w, r, who, name, writeOpts{op: store.OpAddRule, created: http.StatusCreated, ok: http.StatusCreated,
		location: "/v1/policies/" + name + "/rules/" + rule.ID},
		func(cur *rules.Policy, _ store.Record) (*rules.Policy, string, *apiError) {
			if cur == nil {
				return nil, "", notFoundPolicy(name)
			}
			if ruleIndex(cur, rule.ID) >= 0 {
				return nil, "", errf(http.StatusConflict, "duplicate_rule", "policy "+strconv.Quote(name)+" already has a rule "+strconv.Quote(rule.ID))
			}
			cur.Rules = append(cur.Rules, *rule)
			return cur, rule.ID, nil
		})
}

func (s *Server) putRule(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	rule, err := rules.ParseRule(body, "")
	if err != nil {
		invalidBody(err, body).write(w)
		return
	}
	if rule.ID != id {
		e := errf(http.StatusBadRequest, "invalid_document", "the document is invalid: 1 problem(s)")
		e.details = []Detail{{Field: "id", Message: "must be " + strconv.Quote(id) + " (the id in the path)"}}
		e.write(w)
		return
	}
	s.write(w, r, who, name, writeOpts{op: store.OpPutRule, created: http.StatusOK, ok: http.StatusOK},
		func(cur *rules.Policy, _ store.Record) (*rules.Policy, string, *apiError) {
			if cur == nil {
				return nil, "", notFoundPolicy(name)
			}
			if i := ruleIndex(cur, id); i >= 0 {
				cur.Rules[i] = *rule
			} else {
				cur.Rules = append(cur.Rules, *rule)
			}
			return cur, id, nil
		})
}

func (s *Server) deleteRule(w http.ResponseWriter, r *http.Request, who role) {
	name, ok := policyName(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	s.write(w, r, who, name, writeOpts{op: store.OpDeleteRule, ok: http.StatusOK},
		func(cur *rules.Policy, _ store.Record) (*rules.Policy, string, *apiError) {
			if cur == nil {
				return nil, "", notFoundPolicy(name)
			}
			i := ruleIndex(cur, id)
			if i < 0 {
				return nil, "", errf(http.StatusNotFound, "not_found", "policy "+strconv.Quote(name)+" has no rule "+strconv.Quote(id))
			}
			cur.Rules = append(cur.Rules[:i], cur.Rules[i+1:]...)
			return cur, id, nil
		})
}

// parseDryRun reads ?dry_run= of a PUT: "true" or "1" asks for a dry run,
// "false", "0" or absent for a write; anything else is 400.
func parseDryRun(r *http.Request) (bool, *apiError) {
	q := r.URL.Query()
	if !q.Has("dry_run") {
		return false, nil
	}
	switch v := q.Get("dry_run"); v {
	case "true", "1", "":
		return true, nil
	case "false", "0":
		return false, nil
	default:
		return false, errf(http.StatusBadRequest, "invalid_parameter", "dry_run: want true or false, got "+strconv.Quote(v))
	}
}

// answerDryRun answers a dry run that passed every check: the status the
// write would have had (201 for a creation, 200 otherwise), the header
// X-Sluice-Dry-Run: true, the ETag of the current version (the tag an
// If-Match write would need; none when the policy does not exist), and the
// document as it would be stored (its "version" the one it would get).
func (s *Server) answerDryRun(w http.ResponseWriter, rec store.Record, doc []byte, o writeOpts) {
	w.Header().Set("X-Sluice-Dry-Run", "true")
	status := o.ok
	if rec.Exists() {
		w.Header().Set("ETag", etag(rec))
	} else {
		status = o.created
	}
	if doc == nil {
		writeJSON(w, status, deleted{Policy: rec.Name, Version: rec.Version + 1, Deleted: true})
		return
	}
	writeRaw(w, status, doc)
}

// warn sets a Warning header (RFC 7234 section 5.5: warn-code 299, "-" for the
// agent, the text quoted) for each of warnings (Options.Warnings about the
// policy written), just before the answer that writes it.
func (s *Server) warn(w http.ResponseWriter, warnings []string) {
	for _, text := range warnings {
		w.Header().Add("Warning", "299 - "+strconv.Quote(text))
	}
}
