package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// client talks to the control plane's REST API (controlplane/openapi.yaml).
type client struct {
	base              string
	adminTok, readTok string
	http              *http.Client
	actor             string
	// warn receives the server's warnings, a line "Warning: text" each.
	warn io.Writer
}

// response is an HTTP response read in full.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// serverError is an error response of the API: {"error": {...}}.
type serverError struct {
	Status  int
	Header  http.Header
	Code    string
	Message string
	Details []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	}
}

func (e *serverError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server answered %d", e.Status)
	if e.Code != "" {
		fmt.Fprintf(&b, " %s", e.Code)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	for _, d := range e.Details {
		if d.Field != "" {
			fmt.Fprintf(&b, "\n  %s: %s", d.Field, d.Message)
		} else {
			fmt.Fprintf(&b, "\n  %s", d.Message)
		}
	}
	if e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden {
		b.WriteString("\n  tokens: --token or SLUICE_ADMIN_TOKEN for writes; --read-token or SLUICE_READ_TOKEN for reads")
	}
	return b.String()
}

// exitCode is 2 for a document or parameter the server found invalid (400),
// 3 otherwise.
func (e *serverError) exitCode() int {
	if e.Status == http.StatusBadRequest {
		return ExitUsage
	}
	return ExitServer
}

// networkError is a request that got no HTTP answer.
type networkError struct {
	base string
	err  error
}

func (e *networkError) Error() string {
	return "cannot reach the control plane at " + e.base + " (--server, SLUICE_SERVER): " + e.err.Error()
}

// foreignError is an answer that did not come from a sluice control plane:
// something else listens at --server (a proxy, a web server).
type foreignError struct {
	base, why string
}

func (e *foreignError) Error() string {
	return "the server at " + e.base + " does not answer as a sluice control plane (" + e.why + "); check --server or SLUICE_SERVER"
}

// do sends one request; write selects the admin token (else the read
// token, or the admin token when no read token is set). It returns a
// networkError when no response arrived.
func (c *client) do(ctx context.Context, method, path string, body []byte, write bool, headers ...string) (*response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, &networkError{c.base, err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sluicectl")
	if write && c.actor != "" {
		req.Header.Set("X-Sluice-Actor", c.actor)
	}
	tok := c.readTok
	if write || tok == "" {
		tok = c.adminTok
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &networkError{c.base, err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, &networkError{c.base, err}
	}
	b = c.redact(b)
	// Every answer of the API but 304 is JSON (controlplane/openapi.yaml).
	if resp.StatusCode != http.StatusNotModified {
		if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			return nil, &foreignError{c.base, fmt.Sprintf("%s %s answered %d with Content-Type %q", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))}
		}
	}
	c.printWarnings(resp.Header)
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// redact replaces every token of c in b with "[token]": whatever is printed of
// an answer never shows one (a server that is not the control plane may echo
// the request's headers).
func (c *client) redact(b []byte) []byte {
	for _, tok := range []string{c.adminTok, c.readTok} {
		if tok != "" {
			b = bytes.ReplaceAll(b, []byte(tok), []byte("[token]"))
		}
	}
	return b
}

// printWarnings writes each Warning header of an answer ("299 - \"text\"",
// RFC 7234 section 5.5) to c.warn as "Warning: text", as kubectl does.
func (c *client) printWarnings(h http.Header) {
	if c.warn == nil {
		return
	}
	for _, v := range h.Values("Warning") {
		text := v
		if rest, ok := strings.CutPrefix(v, "299 - "); ok {
			if u, err := strconv.Unquote(rest); err == nil {
				text = u
			}
		}
		fmt.Fprintln(c.warn, "Warning:", string(c.redact([]byte(text))))
	}
}

// policyETag checks that a policy answer carries the API's entity tag
// "v<version>.<epoch>.<sum>" and returns it.
func (c *client) policyETag(r *response, what string) (string, error) {
	tag := r.Header.Get("ETag")
	if tagVersion(tag) == 0 {
		return "", &foreignError{c.base, fmt.Sprintf("%s answered %d without a policy ETag", what, r.Status)}
	}
	return tag, nil
}

// apiError returns the serverError of a response with status ≥ 400.
func (r *response) apiError() *serverError {
	e := &serverError{Status: r.Status, Header: r.Header}
	var b struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Details []struct {
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(r.Body, &b) == nil {
		e.Code, e.Message, e.Details = b.Error.Code, b.Error.Message, b.Error.Details
	} else {
		e.Message = strings.TrimSpace(string(r.Body))
	}
	return e
}

// accept returns a check of do's result: the response if its status is
// one of ok, else its serverError (or do's error).
func accept(ok ...int) func(*response, error) (*response, error) {
	return func(r *response, err error) (*response, error) {
		if err != nil {
			return nil, err
		}
		for _, s := range ok {
			if r.Status == s {
				return r, nil
			}
		}
		return nil, r.apiError()
	}
}

// getPolicy returns the policy's document and ETag, or nil when it does
// not exist.
func (c *client) getPolicy(ctx context.Context, name string) (doc []byte, etag string, err error) {
	r, err := accept(http.StatusOK, http.StatusNotFound)(c.do(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(name), nil, false))
	if err != nil {
		return nil, "", err
	}
	if r.Status == http.StatusNotFound {
		if r.apiError().Code == "" {
			return nil, "", &foreignError{c.base, "GET of policy " + name + " answered 404 without the API's error body"}
		}
		return nil, "", nil
	}
	tag, err := c.policyETag(r, "GET of policy "+name)
	if err != nil {
		return nil, "", err
	}
	return r.Body, tag, nil
}

// putPolicy writes doc as policy name: with If-Match etag, or If-None-Match:
// * (create only) when etag is empty; dryRun asks the server to check
// without writing.
func (c *client) putPolicy(ctx context.Context, name string, doc []byte, etag string, dryRun bool) (*response, error) {
	path := "/v1/policies/" + url.PathEscape(name)
	if dryRun {
		path += "?dry_run=true"
	}
	cond := []string{"If-None-Match", "*"}
	if etag != "" {
		cond = []string{"If-Match", etag}
	}
	r, err := accept(http.StatusOK, http.StatusCreated)(c.do(ctx, http.MethodPut, path, doc, true, cond...))
	if err != nil {
		return nil, err
	}
	if dryRun && r.Status == http.StatusCreated && r.Header.Get("X-Sluice-Dry-Run") == "true" {
		return r, nil // nothing was written, so there is no version to tag
	}
	if _, err := c.policyETag(r, "PUT of policy "+name); err != nil {
		return nil, err
	}
	return r, nil
}

// tagVersion reads the version out of an ETag "v<version>.<epoch>.<sum>"
// (0 if it is not one).
func tagVersion(tag string) uint64 {
	rest, ok := strings.CutPrefix(tag, `"v`)
	if !ok {
		return 0
	}
	v, _, _ := strings.Cut(strings.TrimSuffix(rest, `"`), ".")
	n, _ := strconv.ParseUint(v, 10, 64)
	return n
}

// age formats a duration rounded to the second ("0s" below one).
func age(d time.Duration) string {
	if d < time.Second {
		return "0s"
	}
	return d.Round(time.Second).String()
}
