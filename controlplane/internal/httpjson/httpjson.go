// Package httpjson is what every control-plane endpoint answers with: JSON bodies
// with the same headers, the one error body, and the bearer-token check of RFC 6750.
// The REST API (package api) and the quota service (package quota) both use it, so an
// Envoy, sluicectl and a script see one format and one set of headers.
package httpjson

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Detail is one problem in a request document.
type Detail struct {
	// Field is the JSON path of the offending value ("rules[2].window"); empty
	// for the document as a whole.
	Field string `json:"field"`
	// Message says what is wrong.
	Message string `json:"message"`
	// Offset, Line and Column locate a problem found while reading a JSON body:
	// its byte offset, and the 1-based line and column (bytes) of that offset.
	// Absent otherwise.
	Offset *int `json:"offset,omitempty"`
	Line   int  `json:"line,omitempty"`
	Column int  `json:"column,omitempty"`
}

// Locate returns d with Offset, Line and Column set for byte offset off of body
// (clamped to the body).
func (d Detail) Locate(body []byte, off int) Detail {
	off = max(0, min(off, len(body)))
	line, col := 1, 1
	for _, c := range body[:off] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	d.Offset, d.Line, d.Column = &off, line, col
	return d
}

// ErrorBody is the JSON body of every error response:
// {"error": {"code": ..., "message": ..., "details": [...]}}.
type ErrorBody struct {
	Error struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Details []Detail `json:"details,omitempty"`
	} `json:"error"`
}

// WriteError answers status with an ErrorBody of code (a stable snake_case name),
// message (for people) and details (nil for none).
func WriteError(w http.ResponseWriter, status int, code, message string, details []Detail) {
	var b ErrorBody
	b.Error.Code, b.Error.Message, b.Error.Details = code, message, details
	WriteJSON(w, status, b)
}

// WriteJSON answers status with v encoded by encoding/json, without escaping
// <, > and & (the body is never HTML: messages such as "must be > 0" read as
// written), or a 500 error body if v cannot be encoded.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		WriteRaw(w, http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encode response"}}`))
		return
	}
	WriteRaw(w, status, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// WriteRaw answers status with body, a JSON document, and the headers of every
// answer: Content-Type application/json, Cache-Control no-cache (a cache must ask
// again before reusing it, RFC 9111 §5.2.2.4) and X-Content-Type-Options nosniff.
func WriteRaw(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// BearerToken returns the token of r's "Authorization: Bearer <token>" header
// (RFC 6750 §2.1; the scheme is case-insensitive). When the header is missing or
// malformed it answers 401 unauthorized with a WWW-Authenticate challenge (§3) and
// returns false.
func BearerToken(w http.ResponseWriter, r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, found := strings.Cut(h, " ")
	token = strings.TrimSpace(token)
	if h == "" || !found || !strings.EqualFold(scheme, "Bearer") || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		WriteError(w, http.StatusUnauthorized, "unauthorized", "missing bearer token (Authorization: Bearer <token>)", nil)
		return "", false
	}
	return token, true
}

// Forbidden answers 403 forbidden with message and a WWW-Authenticate challenge
// carrying error="<reason>" (RFC 6750 §3.1: invalid_token or insufficient_scope).
func Forbidden(w http.ResponseWriter, reason, message string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice", error="`+reason+`"`)
	WriteError(w, http.StatusForbidden, "forbidden", message, nil)
}

// CheckJSON reports whether r's body is declared application/json (RFC 8259
// §11), parameters such as charset allowed; when it is not, it returns the
// message of the 415 unsupported_media_type to answer. Other JSON media types
// are refused on purpose: a patch (application/merge-patch+json, RFC 7396;
// application/json-patch+json, RFC 6902) must never be taken for a whole
// document.
func CheckJSON(r *http.Request) (message string, ok bool) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != "application/json" {
		return "Content-Type must be application/json, got " + strconv.Quote(ct), false
	}
	return "", true
}

// LogRefusedToken logs, as a warning, a request refused for its bearer token
// (403 invalid_token): where it came from, what it asked and why (what, e.g.
// "not the quota token"), never the token itself, so an operator can find a
// proxy or a tool holding a stale one. At most one line every ten seconds per
// last (the time of the previous line, Unix ns), however many are refused.
func LogRefusedToken(log *slog.Logger, last *atomic.Int64, r *http.Request, what string) {
	now := time.Now().UnixNano()
	prev := last.Load()
	if now-prev < int64(10*time.Second) || !last.CompareAndSwap(prev, now) {
		return
	}
	log.Warn("refused a request whose bearer token is "+what+" (more may follow unlogged for 10s)",
		"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "user_agent", r.UserAgent())
}
