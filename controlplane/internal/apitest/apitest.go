// Package apitest is the tests' HTTP client for the control plane: every
// response it receives is validated against controlplane/openapi.yaml with
// kin-openapi (openapi3filter.ValidateResponse, undeclared status codes
// included), and a mismatch fails the test.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/sluice-proxy/sluice/controlplane"
)

var (
	loadOnce sync.Once
	loadErr  error
	specData []byte
)

// Doc loads and validates the OpenAPI document (a fresh copy per call, since
// the router setup rewrites its servers).
func Doc(t testing.TB) *openapi3.T {
	t.Helper()
	loadOnce.Do(func() {
		l := openapi3.NewLoader()
		doc, err := l.LoadFromData(controlplane.OpenAPI)
		if err == nil {
			err = doc.Validate(context.Background())
		}
		loadErr = err
		specData = controlplane.OpenAPI
	})
	if loadErr != nil {
		t.Fatalf("apitest: openapi.yaml: %v", loadErr)
	}
	doc, err := openapi3.NewLoader().LoadFromData(specData)
	if err != nil {
		t.Fatalf("apitest: openapi.yaml: %v", err)
	}
	return doc
}

// Client sends requests to one server and validates the responses.
type Client struct {
	t      testing.TB
	base   string
	doc    *openapi3.T
	router routers.Router
	// Token, when set, is sent as Authorization: Bearer <Token>.
	Token string
	// HTTP is the underlying client.
	HTTP *http.Client
}

// New returns a client for the server at baseURL (http://host:port).
func New(t testing.TB, baseURL, token string) *Client {
	t.Helper()
	doc := Doc(t)
	doc.Servers = openapi3.Servers{{URL: baseURL}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("apitest: router: %v", err)
	}
	return &Client{t: t, base: baseURL, doc: doc, router: router, Token: token,
		HTTP: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 2000, MaxConnsPerHost: 0}}}
}

// Response is a received, validated response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// ETag returns the ETag header.
func (r *Response) ETag() string { return r.Header.Get("ETag") }

// JSON decodes the body into v, failing the test on error.
func (r *Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// ErrorCode returns error.code of an error body ("" if none).
func (r *Response) ErrorCode() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.Body, &e)
	return e.Error.Code
}

// Do sends a request; headers are name, value pairs ("Host" sets the Host
// header sent). A non-nil body is sent as application/json unless a
// Content-Type header is given. Failures are
// reported with t.Errorf (safe from any goroutine); the returned Response
// then has Status 0.
func (c *Client) Do(method, path string, body []byte, headers ...string) *Response {
	return c.DoContext(context.Background(), method, path, body, headers...)
}

// DoContext is Do with a context.
func (c *Client) DoContext(ctx context.Context, method, path string, body []byte, headers ...string) *Response {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Errorf("apitest: %s %s: %v", method, path, err)
		return &Response{}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			req.Host = headers[i+1]
			continue
		}
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			c.t.Errorf("apitest: %s %s: %v", method, path, err)
		}
		return &Response{}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Errorf("apitest: %s %s: read body: %v", method, path, err)
		return &Response{}
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}
	if err := c.validate(req, r); err != nil {
		c.t.Errorf("apitest: %s %s → %d does not match openapi.yaml: %v\nbody: %.600s", method, path, r.Status, err, data)
	}
	if r.Status == http.StatusInternalServerError {
		c.t.Errorf("apitest: %s %s → 500: %s", method, path, data)
	}
	return r
}

var etagRE = regexp.MustCompile(`^"v[0-9]+\.[0-9a-f]*\.[0-9a-f]{16}"$`)

// validate checks r against the document.
func (c *Client) validate(req *http.Request, r *Response) error {
	if r.Status == http.StatusNotModified {
		if !etagRE.MatchString(r.ETag()) || len(r.Body) != 0 {
			return fmt.Errorf("304 without a valid ETag or with a body (ETag %q)", r.ETag())
		}
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		// Not a documented operation (unknown path, or a method the path
		// does not have): the answer must be a JSON 404 or 405 error.
		if r.Status != http.StatusNotFound && r.Status != http.StatusMethodNotAllowed {
			return fmt.Errorf("undocumented request answered %d: %v", r.Status, err)
		}
		if r.Status == http.StatusMethodNotAllowed && r.Header.Get("Allow") == "" {
			return fmt.Errorf("405 without Allow")
		}
		return c.validateError(r)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  r.Status,
		Header:  r.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(r.Body)
	return openapi3filter.ValidateResponse(context.Background(), in)
}

func (c *Client) validateError(r *Response) error {
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		return fmt.Errorf("error response with Content-Type %q", r.Header.Get("Content-Type"))
	}
	var v any
	if err := json.Unmarshal(r.Body, &v); err != nil {
		return err
	}
	return c.doc.Components.Schemas["Error"].Value.VisitJSON(v)
}
